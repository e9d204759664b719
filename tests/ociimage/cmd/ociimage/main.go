// Command ociimage writes an OCI image layout holding one static binary on
// an empty base, the way `make oci` builds the agent and function images
// without a container engine. With -platform (repeatable), the layout holds
// an image index with one image per platform, each from its own
// cross-built binary.
//
//	ociimage -binary bin/image-prefetcher -user 0:0 -ref ghcr.io/x/y:v1 -out out/oci/image-prefetcher
//	ociimage -platform linux/amd64=out/bin/linux_amd64/image-prefetcher -platform linux/arm64=out/bin/linux_arm64/image-prefetcher -ref ... -out ...
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

type platforms []string

func (p *platforms) String() string     { return strings.Join(*p, ",") }
func (p *platforms) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	bin := flag.String("binary", "", "static binary to put at /usr/local/bin/<name> as the entrypoint")
	user := flag.String("user", "", "user the entrypoint runs as (default: 0:0 for image-prefetcher, as ociimage.Agent; 65532:65532 otherwise)")
	ref := flag.String("ref", "", "reference recorded in the layout's index (org.opencontainers.image.ref.name)")
	out := flag.String("out", "", "layout directory to (re)create")
	arch := flag.String("arch", runtime.GOARCH, "image architecture (must match the binary)")
	var plats platforms
	flag.Var(&plats, "platform", "os/arch=binary: one image of an image index (repeatable; replaces -binary and -arch)")
	flag.Parse()
	if (*bin == "") == (len(plats) == 0) || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: ociimage (-binary FILE [-arch A] | -platform OS/ARCH=FILE...) -out DIR [-user U] [-ref REF]")
		os.Exit(2)
	}
	if err := run(*bin, *arch, plats, *user, *ref, *out); err != nil {
		fmt.Fprintf(os.Stderr, "ociimage: %v\n", err)
		os.Exit(1)
	}
}

func build(bin, osName, arch, user string) (v1.Image, error) {
	spec := ociimage.Function(filepath.Dir(bin))
	if filepath.Base(bin) == "image-prefetcher" {
		spec = ociimage.Agent(filepath.Dir(bin))
	}
	spec.Files[0].Path = "/usr/local/bin/" + filepath.Base(bin)
	spec.Files[0].Source = bin
	spec.Entrypoint = []string{spec.Files[0].Path}
	if user != "" {
		spec.User = user
	}
	spec.OS, spec.Arch = osName, arch
	return ociimage.Build(spec)
}

func run(bin, arch string, plats platforms, user, ref, out string) error {
	if bin != "" {
		img, err := build(bin, "linux", arch, user)
		if err != nil {
			return err
		}
		if err := ociimage.WriteLayout(out, img, ref); err != nil {
			return err
		}
		d, _ := img.Digest()
		fmt.Printf("%s -> %s (%s, user %s)\n", bin, out, d, user)
		return nil
	}
	var imgs []v1.Image
	for _, p := range plats {
		platform, file, ok := strings.Cut(p, "=")
		osName, a, ok2 := strings.Cut(platform, "/")
		if !ok || !ok2 || file == "" {
			return fmt.Errorf("-platform %q: want os/arch=binary", p)
		}
		img, err := build(file, osName, a, user)
		if err != nil {
			return fmt.Errorf("%s: %w", platform, err)
		}
		d, _ := img.Digest()
		fmt.Printf("%s: %s -> %s\n", platform, file, d)
		imgs = append(imgs, img)
	}
	idx, err := ociimage.Index(imgs...)
	if err != nil {
		return err
	}
	if err := ociimage.WriteLayoutIndex(out, idx, ref); err != nil {
		return err
	}
	d, _ := idx.Digest()
	fmt.Printf("%s (image index %s, user %s)\n", out, d, user)
	return nil
}
