package runtimes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// pushData pushes a small two-layer data image, derived from seed, as
// repoTag in the run's registry, and returns it.
func pushData(ctx context.Context, t *testing.T, repoTag string, seed int64) v1.Image {
	t.Helper()
	img, err := ociimage.Data(seed, 64<<10, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Push(ctx, img, repoTag); err != nil {
		t.Fatalf("push %s: %v", repoTag, err)
	}
	return img
}

// pushForeignIndex pushes an image index whose only image is for
// linux/s390x: no platform of this machine matches.
func pushForeignIndex(ctx context.Context, t *testing.T, repoTag string) {
	t.Helper()
	img, err := ociimage.Data(100, 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add:        img,
		Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}},
	})
	ref, err := name.ParseReference(cluster.RegistryAddr+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithTransport(c.RegistryTransport())); err != nil {
		t.Fatalf("push index %s: %v", repoTag, err)
	}
}

// pushSchema1 pushes a Docker schema-1 manifest with one layer as repo:tag,
// served with schema 1's signed media type (what registries serve old
// images as; the signature is not checked before the media type is).
func pushSchema1(ctx context.Context, t *testing.T, repo, tag string) {
	t.Helper()
	img, err := ociimage.Data(101, 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.NewRepository(cluster.RegistryAddr+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(r, layers[0], remote.WithContext(ctx), remote.WithTransport(c.RegistryTransport())); err != nil {
		t.Fatalf("push layer: %v", err)
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	v1c, _ := json.Marshal(map[string]any{"id": strings.Repeat("a", 64), "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z"})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 1, "name": repo, "tag": tag, "architecture": "amd64",
		"fsLayers": []map[string]string{{"blobSum": d.String()}},
		"history":  []map[string]string{{"v1Compatibility": string(v1c)}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, fmt.Sprintf("http://%s/v2/%s/manifests/%s", cluster.RegistryAddr, repo, tag), bytes.NewReader(manifest))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", string(types.DockerManifestSchema1Signed))
	resp, err := (&http.Client{Transport: c.RegistryTransport()}).Do(req)
	if err != nil {
		t.Fatalf("push schema-1 manifest: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("push schema-1 manifest: %s", resp.Status)
	}
}

var (
	storeOnce sync.Once
	store     = &registry.ExpiredObjectStore{}
	storeErr  error
)

// startObjectStore serves the expired object store in the run's namespace
// on objectStoreAddr, once; it lives as long as the cluster.
func startObjectStore(t *testing.T) {
	t.Helper()
	storeOnce.Do(func() {
		l, err := c.NetNS.Listen("tcp", objectStoreAddr)
		if err != nil {
			storeErr = err
			return
		}
		go func() { _ = http.Serve(l, store) }()
	})
	if storeErr != nil {
		t.Fatalf("object store: %v", storeErr)
	}
}

var (
	ctrVersionOnce sync.Once
	ctrVersion     string
)

// containerd16Version is the version of the containerd in PATH, "v1.6.20".
func containerd16Version() string {
	ctrVersionOnce.Do(func() {
		out, err := exec.Command("containerd", "--version").Output()
		if err != nil {
			ctrVersion = "unknown"
			return
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "1.") || strings.HasPrefix(f, "v1.") {
				v, _, _ := strings.Cut(strings.TrimPrefix(f, "v"), "~")
				ctrVersion = "v" + v
				return
			}
		}
		ctrVersion = strings.TrimSpace(string(out))
	})
	return ctrVersion
}
