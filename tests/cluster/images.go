package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Registry returns the run's registry, to switch faults on and read
// counters. Nil in control-plane-only mode.
func (c *Cluster) Registry() *registry.Registry { return c.registry }

// startRegistry serves the registry inside the namespace on RegistryAddr
// and on port 80, where every name in MirroredHosts points on the nodes, so
// that containerd talks to it as if it were ghcr.io itself (credentials
// from pull secrets keyed by the real host name then apply unchanged).
func (c *Cluster) startRegistry() error {
	c.registry = registry.New()
	var stops []func()
	for _, addr := range []string{RegistryAddr, "127.0.0.1:80"} {
		l, err := c.NetNS.Listen("tcp", addr)
		if err != nil {
			for _, s := range stops {
				s()
			}
			return fmt.Errorf("registry listen on %s in the namespace: %w", addr, err)
		}
		stops = append(stops, c.registry.Serve(l))
	}
	c.regStop = func() {
		for _, s := range stops {
			s()
		}
	}
	c.progress("registry listening on %s (and :80 for %s)", RegistryAddr, strings.Join(MirroredHosts, ", "))
	return nil
}

// RegistryTransport is an HTTP transport whose connections are made inside
// the namespace, for clients of the registry in the test process.
func (c *Cluster) RegistryTransport() http.RoundTripper {
	return &http.Transport{DialContext: c.NetNS.DialContext, MaxIdleConnsPerHost: 8, IdleConnTimeout: 30 * time.Second}
}

// Push uploads img to the run's registry as repoTag ("team/app:v1"). Pods
// then pull it as "ghcr.io/team/app:v1" (or any MirroredHosts name). opts
// can carry credentials for a repository protected with RequireAuth.
func (c *Cluster) Push(ctx context.Context, img v1.Image, repoTag string, opts ...remote.Option) error {
	if len(c.Nodes()) == 0 {
		return errors.New("no registry in control-plane-only mode")
	}
	opts = append([]remote.Option{remote.WithTransport(c.RegistryTransport())}, opts...)
	return ociimage.Push(ctx, img, RegistryAddr+"/"+strings.TrimPrefix(repoTag, "/"), opts...)
}

// PushLayout uploads the image of an OCI layout directory (as written by
// `make oci`) as repoTag.
func (c *Cluster) PushLayout(ctx context.Context, dir, repoTag string, opts ...remote.Option) error {
	img, err := ociimage.ReadLayout(dir)
	if err != nil {
		return err
	}
	return c.Push(ctx, img, repoTag, opts...)
}

// PushLayoutIndex uploads the image index of an OCI layout directory (as
// written by `make oci`: one image per platform) as repoTag, so that a
// runtime pulling the tag resolves its own platform's entry.
func (c *Cluster) PushLayoutIndex(ctx context.Context, dir, repoTag string, opts ...remote.Option) error {
	idx, err := ociimage.ReadLayoutIndex(dir)
	if err != nil {
		return err
	}
	if len(c.Nodes()) == 0 {
		return errors.New("no registry in control-plane-only mode")
	}
	opts = append([]remote.Option{remote.WithTransport(c.RegistryTransport())}, opts...)
	return ociimage.PushIndex(ctx, idx, RegistryAddr+"/"+strings.TrimPrefix(repoTag, "/"), opts...)
}

// pushPause builds the sandbox image and pushes it where PauseImage points.
func (c *Cluster) pushPause(ctx context.Context) error {
	if err := c.PushPause(ctx, strings.TrimPrefix(PauseImage, "registry.k8s.io/"), "65535:65535"); err != nil {
		return fmt.Errorf("push pause image: %w", err)
	}
	c.progress("pause image pushed as %s", PauseImage)
	return nil
}

// ProjectBinDir is ./bin of the repository this test runs in, where `make
// build` puts image-prefetcher and image-prefetcher-fn.
func ProjectBinDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "bin"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// PushProjectImages builds the agent and function images from binDir (""
// for ProjectBinDir) exactly as `make oci` does, and pushes them under
// their default references (fn/version), so that rendered manifests pull
// them unchanged. It returns the references pods use.
func (c *Cluster) PushProjectImages(ctx context.Context, binDir string) (agentRef, fnRef string, err error) {
	if binDir == "" {
		if binDir, err = ProjectBinDir(); err != nil {
			return "", "", err
		}
	}
	agentRef = version.AgentImage()
	fnRef = version.FunctionImageRepository + ":" + version.Version
	for _, x := range []struct {
		spec ociimage.Spec
		ref  string
	}{{ociimage.Agent(binDir), agentRef}, {ociimage.Function(binDir), fnRef}} {
		if _, err := os.Stat(x.spec.Files[0].Source); err != nil {
			return "", "", fmt.Errorf("%s is missing: run `make build`", x.spec.Files[0].Source)
		}
		img, err := ociimage.Build(x.spec)
		if err != nil {
			return "", "", err
		}
		repoTag, ok := strings.CutPrefix(x.ref, "ghcr.io/")
		if !ok {
			return "", "", fmt.Errorf("default image %s is not on ghcr.io, which the nodes mirror", x.ref)
		}
		if err := c.Push(ctx, img, repoTag); err != nil {
			return "", "", err
		}
		c.progress("pushed %s", x.ref)
	}
	return agentRef, fnRef, nil
}
