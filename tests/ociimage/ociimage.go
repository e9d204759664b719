// Package ociimage builds container images without a container engine: a
// static binary in one layer on an empty base, with the config a runtime
// needs (entrypoint, user, os/arch). The images are written as OCI layouts
// (what `make oci` produces) or pushed to a registry.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one regular file, or with Dir one directory, in the image.
type File struct {
	// Path inside the image, absolute.
	Path string
	// Source is a host file to copy; Data is used when Source is empty.
	Source string
	Data   []byte
	Mode   int64 // permission bits and sticky bit; default 0o755
	// Dir makes the entry a directory (Source and Data unused).
	Dir bool
	// UID and GID own the entry; default root.
	UID, GID int
}

// Spec describes an image.
type Spec struct {
	// Base, when set, is a layer of its own below Files, shared by every
	// image with the same Base (as a base image's layer is).
	Base       []File
	Files      []File
	Entrypoint []string
	Cmd        []string
	// User as in the OCI config: "0:0", "65532:65532", ...
	User       string
	Env        []string
	WorkingDir string
	Labels     map[string]string
	// OS and Arch default to linux and the architecture of this process.
	OS, Arch string
}

// Binary is the common case: one static binary at /usr/local/bin/<base
// name>, run as user, as the entrypoint (the same layout as the Dockerfiles).
func Binary(src, user string) Spec {
	dst := "/usr/local/bin/" + path.Base(src)
	return Spec{
		Files:      []File{{Path: dst, Source: src, Mode: 0o755}},
		Entrypoint: []string{dst},
		User:       user,
	}
}

// epoch keeps layers reproducible: the same inputs give the same digest.
var epoch = time.Unix(0, 0).UTC()

// Build assembles the image.
func Build(s Spec) (v1.Image, error) {
	if s.OS == "" {
		s.OS = "linux"
	}
	if s.Arch == "" {
		s.Arch = runtime.GOARCH
	}
	groups := [][]File{s.Files}
	if len(s.Base) > 0 {
		groups = [][]File{s.Base, s.Files}
	}
	var layers []v1.Layer
	for _, files := range groups {
		layer, err := filesLayer(files)
		if err != nil {
			return nil, err
		}
		layers = append(layers, layer)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = s.OS, s.Arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.User = s.User
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, s.Env...)
	cf.Config.WorkingDir = s.WorkingDir
	cf.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

func filesLayer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	for _, f := range sorted {
		if !path.IsAbs(f.Path) {
			return nil, fmt.Errorf("image file path %q is not absolute", f.Path)
		}
		data := f.Data
		if f.Source != "" {
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", f.Source, err)
			}
			data = b
		}
		// Parent directories first, so that extraction needs no guessing.
		var parents []string
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, fmt.Errorf("write tar: %w", err)
			}
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		if f.Dir {
			if dirs[f.Path] {
				return nil, fmt.Errorf("directory %s is declared after a file inside it, or twice", f.Path)
			}
			dirs[f.Path] = true
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(f.Path, "/") + "/", Mode: mode, Uid: f.UID, Gid: f.GID, ModTime: epoch}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, fmt.Errorf("write tar: %w", err)
			}
			continue
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Path, "/"), Mode: mode, Uid: f.UID, Gid: f.GID, Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write tar: %w", err)
	}
	tarBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("make layer: %w", err)
	}
	return layer, nil
}

// Data is a non-runnable image of len(layerSizes) layers, each holding one
// file of pseudo-random bytes of that size, derived from seed: the same
// arguments always give the same digests, different seeds different ones.
// Layers are stored uncompressed, so their size on the wire is the size
// asked for (random bytes would not compress anyway).
func Data(seed int64, layerSizes ...int64) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	rnd := rand.New(rand.NewSource(seed))
	for i, size := range layerSizes {
		data := make([]byte, size)
		_, _ = rnd.Read(data)
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("data/%d-%d.bin", seed, i), Mode: 0o644, Size: size, ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		if err := tw.Close(); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		// A static layer serves the tar as is; a tarball layer would gzip it
		// on the wire whatever media type it is labelled with.
		layer := static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)
		var err error
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, fmt.Errorf("append layer: %w", err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{"/does-not-run"}
	return mutate.ConfigFile(img, cf)
}

// RefAnnotation names an image inside an OCI layout's index.
const RefAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes img as an OCI image layout in dir (replacing what was
// there), tagged ref in the index.
func WriteLayout(dir string, img v1.Image, ref string) error {
	p, opts, err := newLayout(dir, ref)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return fmt.Errorf("write image to layout %s: %w", dir, err)
	}
	return nil
}

// Index assembles images of different platforms into one OCI image index,
// each entry's descriptor carrying the os/arch of its config, the way a
// multi-arch release is published: a runtime pulling the index's tag gets
// the entry of its own platform.
func Index(imgs ...v1.Image) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		p := v1.Platform{OS: cf.OS, Architecture: cf.Architecture}
		if seen[p.String()] {
			return nil, fmt.Errorf("two images for %s", p.String())
		}
		seen[p.String()] = true
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// WriteLayoutIndex writes idx as an OCI image layout in dir (replacing what
// was there), tagged ref in the layout's index.
func WriteLayoutIndex(dir string, idx v1.ImageIndex, ref string) error {
	p, opts, err := newLayout(dir, ref)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, opts...); err != nil {
		return fmt.Errorf("write index to layout %s: %w", dir, err)
	}
	return nil
}

// newLayout replaces dir with an empty OCI layout and returns it with the
// options that tag what is appended to it as ref (none when ref is empty).
func newLayout(dir, ref string) (layout.Path, []layout.Option, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", nil, fmt.Errorf("clear %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", nil, fmt.Errorf("create layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{RefAnnotation: ref}))
	}
	return p, opts, nil
}

// ReadLayoutIndex returns the image index the OCI layout in dir holds (as
// `make oci` writes it).
func ReadLayoutIndex(dir string) (v1.ImageIndex, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("open layout %s: %w", dir, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("read layout index %s: %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read layout index %s: %w", dir, err)
	}
	if len(m.Manifests) == 0 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("layout %s holds no image index", dir)
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}

// PlatformImage returns the entry of idx for os/arch.
func PlatformImage(idx v1.ImageIndex, os, arch string) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.OS == os && d.Platform.Architecture == arch {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("the index has no image for %s/%s", os, arch)
}

// ReadLayout returns the first image of the OCI layout in dir; when the
// layout holds an image index, its entry for this machine's platform.
func ReadLayout(dir string) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("open layout %s: %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("read layout index %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read layout index %s: %w", dir, err)
	}
	if len(m.Manifests) == 0 {
		return nil, fmt.Errorf("layout %s holds no image", dir)
	}
	if m.Manifests[0].MediaType.IsIndex() {
		child, err := idx.ImageIndex(m.Manifests[0].Digest)
		if err != nil {
			return nil, fmt.Errorf("read image index from layout %s: %w", dir, err)
		}
		return PlatformImage(child, "linux", runtime.GOARCH)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("read image from layout %s: %w", dir, err)
	}
	return img, nil
}

// Push uploads img as ref. Registries on 127.0.0.0/8 and localhost are
// spoken to over plain HTTP. Extra options carry a transport (a dialer into
// a network namespace) or credentials.
func Push(ctx context.Context, img v1.Image, ref string, opts ...remote.Option) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return fmt.Errorf("parse reference %q: %w", ref, err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuth(authn.Anonymous)}, opts...)
	if err := remote.Write(r, img, opts...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// PushIndex uploads idx, every image of it included, as ref, over plain
// HTTP for registries on 127.0.0.0/8 and localhost as Push.
func PushIndex(ctx context.Context, idx v1.ImageIndex, ref string, opts ...remote.Option) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return fmt.Errorf("parse reference %q: %w", ref, err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuth(authn.Anonymous)}, opts...)
	if err := remote.WriteIndex(r, idx, opts...); err != nil {
		return fmt.Errorf("push index %s: %w", ref, err)
	}
	return nil
}

// Agent is the agent image `make oci` builds from binDir/image-prefetcher:
// root, because the agent must reach the root-owned CRI socket.
func Agent(binDir string) Spec {
	s := Binary(binDir+"/image-prefetcher", "0:0")
	s.Base = DistrolessBase()
	return s
}

// Function is the KRM function image `make oci` builds from
// binDir/image-prefetcher-fn: distroless's nonroot user.
func Function(binDir string) Spec {
	s := Binary(binDir+"/image-prefetcher-fn", "65532:65532")
	s.Base = DistrolessBase()
	return s
}

// DistrolessBase is what the Dockerfiles' base, gcr.io/distroless/static-debian12,
// gives a static binary at run time, as a layer built here (no network, no
// registry but the Go proxy): its users and groups, so that the runtime
// finds the image user's home and groups as with distroless (runc sets
// HOME from the image's /etc/passwd: /root for the agent, /home/nonroot for
// the function, "/" without the file), the home directories, and a
// world-writable /tmp.
//
// Deliberately left out, and the only differences that matter: the CA
// bundle (/etc/ssl/certs/ca-certificates.crt), tzdata and
// /etc/os-release. Neither binary makes a TLS connection that uses the
// system roots: the agent talks to the CRI over a unix socket and to the
// API server with the service-account CA that client-go's in-cluster
// config reads from the token volume, the function uses no network at all
// (kpt runs it with --network none), and image pulls are containerd's. The
// host's bundle would also make the digest depend on the machine's
// ca-certificates version. Both binaries use UTC only.
func DistrolessBase() []File {
	return []File{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte(
			"root:x:0:\n" +
				"nobody:x:65534:\n" +
				"tty:x:5:\n" +
				"staff:x:50:\n" +
				"nonroot:x:65532:\n")},
		{Path: "/home", Dir: true, Mode: 0o755},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
		{Path: "/root", Dir: true, Mode: 0o700},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
	}
}
