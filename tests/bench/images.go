package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DataImage is an image of one layer per size, each a tar holding one file
// of pseudo-random bytes derived from seed: the same arguments give the
// same digests. The layers are stored and served uncompressed (random
// bytes would not compress anyway), so the bytes on the wire are the
// sizes asked for plus the tar framing, and no time goes into gzip.
func DataImage(seed int64, layerSizes ...int64) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	rnd := rand.New(rand.NewPCG(uint64(seed), 0x1b5c0de))
	epoch := time.Unix(0, 0).UTC()
	for i, sz := range layerSizes {
		data := make([]byte, sz)
		for j := 0; j+8 <= len(data); j += 8 {
			v := rnd.Uint64()
			for k := range 8 {
				data[j+k] = byte(v >> (8 * k))
			}
		}
		var buf bytes.Buffer
		buf.Grow(int(sz) + 2048)
		tw := tar.NewWriter(&buf)
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("data/%d-%d.bin", seed, i), Mode: 0o644, Size: sz, ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		if err := tw.Close(); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		var err error
		if img, err = mutate.AppendLayers(img, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)); err != nil {
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

// LayerSizes splits an image of total bytes into n layers of falling size
// (n, n-1, ..., 1 parts), as real images have one big base layer and
// smaller ones on top.
func LayerSizes(total int64, n int) []int64 {
	parts := int64(n * (n + 1) / 2)
	out := make([]int64, n)
	var used int64
	for i := range n {
		out[i] = total * int64(n-i) / parts
		used += out[i]
	}
	out[0] += total - used
	return out
}

// pushImages generates the image set from the seed, pushes it and writes
// the image list, every reference pinned by digest.
func (b *bench) pushImages(ctx context.Context) error {
	var refs []string
	for i, total := range b.opts.ImageSizes {
		layers := 2 + i%3
		img, err := DataImage(b.opts.Seed*1000+int64(i), LayerSizes(total, layers)...)
		if err != nil {
			return fmt.Errorf("generate image %d: %w", i, err)
		}
		repo := fmt.Sprintf("bench/app-%02d", i+1)
		if err := b.c.Push(ctx, img, repo+":v1", remote.WithTransport(b.pushTransport())); err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return fmt.Errorf("image digest: %w", err)
		}
		manifest, err := img.RawManifest()
		if err != nil {
			return fmt.Errorf("image manifest: %w", err)
		}
		config, err := img.RawConfigFile()
		if err != nil {
			return fmt.Errorf("image config: %w", err)
		}
		n := int64(len(manifest) + len(config))
		ls, err := img.Layers()
		if err != nil {
			return fmt.Errorf("image layers: %w", err)
		}
		for _, l := range ls {
			sz, err := l.Size()
			if err != nil {
				return fmt.Errorf("layer size: %w", err)
			}
			n += sz
		}
		// Pods name images by their usual registry; every node's
		// containerd sends ghcr.io to the run's registry.
		ref := "ghcr.io/" + repo + "@" + digest.String()
		refs = append(refs, ref)
		b.images = append(b.images, Image{Ref: ref, Layers: len(ls), Bytes: n})
	}
	b.list = filepath.Join(b.dir, "images.txt")
	if err := os.WriteFile(b.list, []byte(strings.Join(refs, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("write image list: %w", err)
	}
	var total int64
	for _, img := range b.images {
		total += img.Bytes
	}
	b.progress("pushed %d images (%s)", len(b.images), size(total))
	return nil
}

// pushTransport keeps no idle connection, so that the registry has none
// open when the first run starts counting.
func (b *bench) pushTransport() http.RoundTripper {
	return &http.Transport{DialContext: b.c.NetNS.DialContext, DisableKeepAlives: true}
}
