// Command ociimage writes an OCI image layout holding one static binary on
// an empty base, the way `make oci` builds the agent and function images
// without a container engine.
//
//	ociimage -binary bin/image-prefetcher -user 0:0 -ref ghcr.io/x/y:v1 -out out/oci/image-prefetcher
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

func main() {
	bin := flag.String("binary", "", "static binary to put at /usr/local/bin/<name> as the entrypoint")
	user := flag.String("user", "", "user the entrypoint runs as (default: 0:0 for image-prefetcher, as ociimage.Agent; 65532:65532 otherwise)")
	ref := flag.String("ref", "", "reference recorded in the layout's index (org.opencontainers.image.ref.name)")
	out := flag.String("out", "", "layout directory to (re)create")
	arch := flag.String("arch", runtime.GOARCH, "image architecture (must match the binary)")
	flag.Parse()
	if *bin == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: ociimage -binary FILE -out DIR [-user U] [-ref REF] [-arch A]")
		os.Exit(2)
	}
	spec := ociimage.Function(filepath.Dir(*bin))
	if filepath.Base(*bin) == "image-prefetcher" {
		spec = ociimage.Agent(filepath.Dir(*bin))
	}
	spec.Files[0].Path = "/usr/local/bin/" + filepath.Base(*bin)
	spec.Files[0].Source = *bin
	spec.Entrypoint = []string{spec.Files[0].Path}
	if *user != "" {
		spec.User = *user
	}
	spec.Arch = *arch
	img, err := ociimage.Build(spec)
	if err == nil {
		err = ociimage.WriteLayout(*out, img, *ref)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ociimage: %v\n", err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Printf("%s -> %s (%s, user %s)\n", *bin, *out, d, *user)
}
