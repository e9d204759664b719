package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

// BinPath is name in the repository's ./bin, where `make build tools` puts
// the agent, the function and the standalone kustomize (ProjectBinDir: the
// Makefile's -trimpath leaves no source path to find it by).
func BinPath(name string) string {
	dir, err := ProjectBinDir()
	if err != nil {
		return filepath.Join("bin", name)
	}
	return filepath.Join(dir, name)
}

// CheckBinaries reports the first of kustomize, the function and the agent
// that ./bin lacks or cannot run; TestMain calls it before starting a
// cluster, so that a missing build fails in a second, not after minutes.
func CheckBinaries() error {
	for _, name := range []string{"kustomize", "image-prefetcher-fn", "image-prefetcher"} {
		if fi, err := os.Stat(BinPath(name)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing: run `make build tools`", BinPath(name))
		}
	}
	return nil
}

// Prefetcher is one ImagePrefetcher with a namespace of its own, rendered
// in generator mode (like examples/quickstart) by the standalone kustomize
// with the function from ./bin: what users run, not a library call.
type Prefetcher struct {
	Name, Namespace string
	// AgentImage is spec.agent.image.
	AgentImage string
	// Spec is YAML under spec: besides agent.image, two-space indented.
	Spec string
	// NamespaceLabels label the namespace (pod security levels).
	NamespaceLabels map[string]string
	// Resources are further files of the kustomization, by file name.
	Resources map[string]string
}

// Write writes the kustomization of p into dir.
func (p Prefetcher) Write(dir string) error {
	var ns strings.Builder
	fmt.Fprintf(&ns, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", p.Namespace)
	if len(p.NamespaceLabels) > 0 {
		ns.WriteString("  labels:\n")
		for _, k := range sortedKeys(p.NamespaceLabels) {
			fmt.Fprintf(&ns, "    %s: %s\n", k, p.NamespaceLabels[k])
		}
	}
	files := map[string]string{"namespace.yaml": ns.String()}
	resources := []string{"namespace.yaml"}
	for _, name := range sortedKeys(p.Resources) {
		files[name] = p.Resources[name]
		resources = append(resources, name)
	}
	files["prefetcher.yaml"] = fmt.Sprintf(`apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: %s
  namespace: %s
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: %s
spec:
  agent:
    image: %s
%s`, p.Name, p.Namespace, BinPath("image-prefetcher-fn"), p.AgentImage, p.Spec)
	files["kustomization.yaml"] = "resources:\n- " + strings.Join(resources, "\n- ") + "\ngenerators:\n- prefetcher.yaml\n"
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// Render writes the kustomization of p into dir and builds it.
func (p Prefetcher) Render(ctx context.Context, dir string) ([]byte, error) {
	if err := p.Write(dir); err != nil {
		return nil, err
	}
	return Kustomize(ctx, dir)
}

// Kustomize runs `kustomize build` from ./bin on dir with exec functions
// enabled (`kubectl kustomize` cannot run them); the error carries stderr.
func Kustomize(ctx context.Context, dir string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, BinPath("kustomize"), "build", "--enable-alpha-plugins", "--enable-exec", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w\n%s", dir, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// Poll calls cond every period until it returns true or ctx ends; the
// error names what was awaited and the last state cond reported.
func Poll(ctx context.Context, period time.Duration, what string, cond func() (bool, string)) error {
	last := ""
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		last = state
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(period):
		}
	}
}

// Pull pulls ref through the node's CRI, as the kubelet would.
func (n *Node) Pull(ctx context.Context, ref string) error {
	cri, err := n.CRI()
	if err != nil {
		return err
	}
	defer cri.Close()
	if _, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		return fmt.Errorf("%s: pull %s: %w", n.Name, ref, err)
	}
	return nil
}

// Remove removes ref through the node's CRI, as the kubelet's image GC
// and `crictl rmi` do.
func (n *Node) Remove(ctx context.Context, ref string) error {
	cri, err := n.CRI()
	if err != nil {
		return err
	}
	defer cri.Close()
	if _, err := cri.Images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		return fmt.Errorf("%s: remove %s: %w", n.Name, ref, err)
	}
	return nil
}

// PushPause pushes a runnable image of the pause binary (blocks until
// SIGTERM) running as user ("uid:gid") under repoTag.
func (c *Cluster) PushPause(ctx context.Context, repoTag, user string) error {
	bin, err := PauseBinary(ctx)
	if err != nil {
		return err
	}
	img, err := ociimage.Build(ociimage.Binary(bin, user))
	if err != nil {
		return err
	}
	if err := c.Push(ctx, img, repoTag); err != nil {
		return fmt.Errorf("push %s: %w", repoTag, err)
	}
	return nil
}
