package ociimage_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

func writeBinary(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// files reads every regular file of the image's layers.
func files(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = h
		}
		rc.Close()
	}
	return out
}

func TestBuildBinary(t *testing.T) {
	tests := []struct {
		name, user string
	}{
		{"image-prefetcher", "0:0"},
		{"image-prefetcher-fn", "65532:65532"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := writeBinary(t, tt.name, "#!binary "+tt.name)
			img, err := ociimage.Build(ociimage.Binary(bin, tt.user))
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			wantEntry := "/usr/local/bin/" + tt.name
			if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != wantEntry {
				t.Errorf("entrypoint = %q, want [%q]", cf.Config.Entrypoint, wantEntry)
			}
			if cf.Config.User != tt.user {
				t.Errorf("user = %q, want %q", cf.Config.User, tt.user)
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("platform = %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
			}
			mt, err := img.MediaType()
			if err != nil || mt != types.OCIManifestSchema1 {
				t.Errorf("manifest media type = %s (%v), want OCI", mt, err)
			}
			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers: %v %v", layers, err)
			}
			if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
				t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
			}
			rc, err := layers[0].Compressed()
			if err != nil {
				t.Fatal(err)
			}
			magic := make([]byte, 2)
			_, err = io.ReadFull(rc, magic)
			rc.Close()
			if err != nil || magic[0] != 0x1f || magic[1] != 0x8b {
				t.Errorf("gzip layer does not start with the gzip magic: %x %v", magic, err)
			}
			fs := files(t, img)
			h, ok := fs["usr/local/bin/"+tt.name]
			if !ok {
				t.Fatalf("binary missing from the layer; files: %v", fs)
			}
			if h.Mode&0o111 == 0 || h.Size != int64(len("#!binary "+tt.name)) {
				t.Errorf("binary header mode %o size %d", h.Mode, h.Size)
			}
			for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
				if h, ok := fs[d]; !ok || h.Typeflag != tar.TypeDir {
					t.Errorf("parent directory %s missing", d)
				}
			}
			// Same inputs, same digest: layouts and pushes are reproducible.
			again, err := ociimage.Build(ociimage.Binary(bin, tt.user))
			if err != nil {
				t.Fatal(err)
			}
			d1, _ := img.Digest()
			d2, _ := again.Digest()
			if d1 != d2 {
				t.Errorf("digests differ between two builds: %s %s", d1, d2)
			}
		})
	}
}

func TestBuildRejectsRelativePath(t *testing.T) {
	_, err := ociimage.Build(ociimage.Spec{Files: []ociimage.File{{Path: "bin/x", Data: []byte("x")}}})
	if err == nil {
		t.Fatal("relative path accepted")
	}
}

func TestBuildMissingSource(t *testing.T) {
	_, err := ociimage.Build(ociimage.Binary(filepath.Join(t.TempDir(), "absent"), "0:0"))
	if err == nil {
		t.Fatal("missing binary accepted")
	}
}

func TestLayoutRoundTrip(t *testing.T) {
	bin := writeBinary(t, "app", "app")
	img, err := ociimage.Build(ociimage.Binary(bin, "0:0"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	if err := ociimage.WriteLayout(dir, img, "ghcr.io/x/app:v1"); err != nil {
		t.Fatal(err)
	}
	// Writing again replaces, never appends.
	if err := ociimage.WriteLayout(dir, img, "ghcr.io/x/app:v1"); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations[ociimage.RefAnnotation] != "ghcr.io/x/app:v1" {
		t.Fatalf("index = %+v", m.Manifests)
	}
	got, err := ociimage.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if d, _ := got.Digest(); d != want {
		t.Fatalf("read back %s, wrote %s", d, want)
	}
	if _, err := ociimage.ReadLayout(t.TempDir()); err == nil {
		t.Fatal("reading an empty directory succeeded")
	}
}

func TestData(t *testing.T) {
	sizes := []int64{1 << 20, 64 << 10, 3}
	a, err := ociimage.Data(7, sizes...)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ociimage.Data(7, sizes...)
	c, _ := ociimage.Data(8, sizes...)
	da, _ := a.Digest()
	db, _ := b.Digest()
	dc, _ := c.Digest()
	if da != db {
		t.Errorf("same seed, different digests")
	}
	if da == dc {
		t.Errorf("different seeds, same digest")
	}
	layers, err := a.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != len(sizes) {
		t.Fatalf("%d layers, want %d", len(layers), len(sizes))
	}
	for i, l := range layers {
		size, err := l.Size()
		if err != nil {
			t.Fatal(err)
		}
		// An uncompressed tar holds the file plus headers and padding.
		if size < sizes[i] {
			t.Errorf("layer %d is %d bytes, want at least %d", i, size, sizes[i])
		}
		// What goes on the wire must be what the media type says: a
		// plain tar holding one file of the asked size.
		mt, err := l.MediaType()
		if err != nil || mt != types.OCIUncompressedLayer {
			t.Errorf("layer %d media type %s (%v)", i, mt, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		h, err := tar.NewReader(rc).Next()
		rc.Close()
		if err != nil || h.Size != sizes[i] {
			t.Errorf("layer %d on the wire is not a tar of one %d-byte file: %v %+v", i, sizes[i], err, h)
		}
	}
}

func TestPush(t *testing.T) {
	reg := registry.New()
	addr, stop, err := reg.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	img, err := ociimage.Build(ociimage.Binary(writeBinary(t, "app", "app"), "65532:65532"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Push(context.Background(), img, addr+"/team/app:v1"); err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(addr+"/team/app:v1", name.Insecure)
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pull back: %v", err)
	}
	want, _ := img.Digest()
	if d, _ := got.Digest(); d != want {
		t.Fatalf("pulled %s, pushed %s", d, want)
	}
	if err := ociimage.Push(context.Background(), img, "Bad::Ref"); err == nil {
		t.Fatal("bad reference accepted")
	}
}

func TestProjectImages(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"image-prefetcher", "image-prefetcher-fn"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		spec       ociimage.Spec
		entrypoint string
		user       string
	}{
		{ociimage.Agent(dir), "/usr/local/bin/image-prefetcher", "0:0"},
		{ociimage.Function(dir), "/usr/local/bin/image-prefetcher-fn", "65532:65532"},
	}
	for _, tt := range tests {
		t.Run(tt.entrypoint, func(t *testing.T) {
			img, err := ociimage.Build(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != tt.entrypoint || cf.Config.User != tt.user {
				t.Fatalf("entrypoint %q user %q, want [%q] %q", cf.Config.Entrypoint, cf.Config.User, tt.entrypoint, tt.user)
			}
		})
	}
}

// repoRoot is the repository root, from this package's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// finalStage returns the FROM, USER and ENTRYPOINT of a Dockerfile's last
// stage (continuation lines are not needed for those three).
func finalStage(t *testing.T, path string) (from, user string, entrypoint []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		cmd, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch strings.ToUpper(cmd) {
		case "FROM":
			from, user, entrypoint = args, "", nil
		case "USER":
			user = args
		case "ENTRYPOINT":
			entrypoint = nil
			if err := json.Unmarshal([]byte(args), &entrypoint); err != nil {
				t.Fatalf("%s: ENTRYPOINT %s is not in exec form: %v", path, args, err)
			}
		}
	}
	return from, user, entrypoint
}

// The images `make oci` builds stand in for the Dockerfiles' images: the
// same entrypoint and user as the Dockerfile's final stage, and, below the
// binary, a layer with what distroless/static gives the binary at run time
// (ociimage.DistrolessBase), shared by both images as the base image's
// layer is. The CA bundle is the one deliberate difference (see
// DistrolessBase): this test fails if it or anything else creeps in.
func TestProjectImagesMatchDockerfiles(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	for _, n := range []string{"image-prefetcher", "image-prefetcher-fn"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var baseDigests []v1.Hash
	for _, tt := range []struct {
		dockerfile string
		spec       ociimage.Spec
		home       string // the image user's home, from /etc/passwd
	}{
		{"Dockerfile", ociimage.Agent(dir), "/root"},
		{"Dockerfile.fn", ociimage.Function(dir), "/home/nonroot"},
	} {
		t.Run(tt.dockerfile, func(t *testing.T) {
			from, user, entrypoint := finalStage(t, filepath.Join(root, tt.dockerfile))
			if !strings.HasPrefix(from, "gcr.io/distroless/static-debian12") {
				t.Fatalf("%s's final stage is FROM %s: DistrolessBase stands in for gcr.io/distroless/static-debian12; revisit it", tt.dockerfile, from)
			}
			img, err := ociimage.Build(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Config.User != user {
				t.Errorf("user %q, %s says USER %s", cf.Config.User, tt.dockerfile, user)
			}
			if !slices.Equal(cf.Config.Entrypoint, entrypoint) {
				t.Errorf("entrypoint %q, %s says %q", cf.Config.Entrypoint, tt.dockerfile, entrypoint)
			}
			layers, err := img.Layers()
			if err != nil || len(layers) != 2 {
				t.Fatalf("want a base layer and the binary's layer, got %d (%v)", len(layers), err)
			}
			d, _ := layers[0].Digest()
			baseDigests = append(baseDigests, d)

			fs := files(t, img)
			var names []string
			for n, h := range fs {
				names = append(names, fmt.Sprintf("%s %o %d:%d", n, h.Mode, h.Uid, h.Gid))
			}
			slices.Sort(names)
			want := []string{
				"etc/ 755 0:0",
				"etc/group 644 0:0",
				"etc/passwd 644 0:0",
				"home/ 755 0:0",
				"home/nonroot/ 700 65532:65532",
				"root/ 700 0:0",
				"tmp/ 1777 0:0",
				"usr/ 755 0:0",
				"usr/local/ 755 0:0",
				"usr/local/bin/ 755 0:0",
				strings.TrimPrefix(entrypoint[0], "/") + " 755 0:0",
			}
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Errorf("image files:\n  %s\nwant:\n  %s", strings.Join(names, "\n  "), strings.Join(want, "\n  "))
			}
			// The image user has an entry, with its home, as in distroless.
			uid, gid, _ := strings.Cut(user, ":")
			passwd := string(fileData(t, img, "etc/passwd"))
			if !strings.Contains(passwd, ":x:"+uid+":"+gid+":") || !strings.Contains(passwd, ":"+tt.home+":") {
				t.Errorf("/etc/passwd has no entry for %s with home %s:\n%s", user, tt.home, passwd)
			}
			if !strings.Contains(string(fileData(t, img, "etc/group")), ":x:"+gid+":") {
				t.Errorf("/etc/group has no group %s", gid)
			}
		})
	}
	if len(baseDigests) == 2 && baseDigests[0] != baseDigests[1] {
		t.Errorf("the two images have different base layers: %v", baseDigests)
	}
}

func fileData(t *testing.T, img v1.Image, name string) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Name == name {
				data, err := io.ReadAll(tr)
				rc.Close()
				if err != nil {
					t.Fatal(err)
				}
				return data
			}
		}
		rc.Close()
	}
	t.Fatalf("%s is not in the image", name)
	return nil
}

// The layouts `make oci` wrote are the images of this build: the same
// digest as ociimage.Agent/Function of ./bin (which the cluster tests push),
// with the Dockerfiles' entrypoint and user and this machine's os/arch.
func TestMakeOCILayouts(t *testing.T) {
	root := repoRoot(t)
	bin := filepath.Join(root, "bin")
	for _, tt := range []struct {
		layout, dockerfile string
		spec               ociimage.Spec
	}{
		{"out/oci/image-prefetcher", "Dockerfile", ociimage.Agent(bin)},
		{"out/oci/image-prefetcher-fn", "Dockerfile.fn", ociimage.Function(bin)},
	} {
		t.Run(tt.layout, func(t *testing.T) {
			img, err := ociimage.ReadLayout(filepath.Join(root, tt.layout))
			if err != nil {
				t.Fatalf("%v: run `make oci`", err)
			}
			want, err := ociimage.Build(tt.spec)
			if err != nil {
				t.Fatalf("%v: run `make build`", err)
			}
			gd, _ := img.Digest()
			wd, _ := want.Digest()
			if gd != wd {
				t.Errorf("%s holds %s, but ./bin gives %s: the layout is stale, run `make oci`", tt.layout, gd, wd)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			_, user, entrypoint := finalStage(t, filepath.Join(root, tt.dockerfile))
			if cf.Config.User != user || !slices.Equal(cf.Config.Entrypoint, entrypoint) {
				t.Errorf("user %q entrypoint %q, %s says %q %q", cf.Config.User, cf.Config.Entrypoint, tt.dockerfile, user, entrypoint)
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
			}
		})
	}
}
