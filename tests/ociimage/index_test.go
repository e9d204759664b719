package ociimage_test

import (
	"bytes"
	"debug/elf"
	"path/filepath"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

// machines are the ELF machine types of the platforms `make oci` builds.
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestMakeOCIIndex: each layout `make oci` wrote holds one OCI image index
// that lists linux/amd64 and linux/arm64; each entry's descriptor platform
// agrees with its image config, and its binary is an ELF executable for
// that machine (EM_X86_64, EM_AARCH64), statically linked. The entries
// differ only in the binary: same user, entrypoint and base layer.
func TestMakeOCIIndex(t *testing.T) {
	root := repoRoot(t)
	for _, tt := range []struct{ layout, binary string }{
		{"out/oci/image-prefetcher", "usr/local/bin/image-prefetcher"},
		{"out/oci/image-prefetcher-fn", "usr/local/bin/image-prefetcher-fn"},
	} {
		t.Run(tt.layout, func(t *testing.T) {
			idx, err := ociimage.ReadLayoutIndex(filepath.Join(root, tt.layout))
			if err != nil {
				t.Fatalf("%v: run `make oci`", err)
			}
			if mt, err := idx.MediaType(); err != nil || mt != types.OCIImageIndex {
				t.Errorf("index media type %s (%v), want %s", mt, err, types.OCIImageIndex)
			}
			m, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			var platforms []string
			var configs []*v1.ConfigFile
			for _, d := range m.Manifests {
				if d.Platform == nil {
					t.Fatalf("entry %s has no platform", d.Digest)
				}
				platforms = append(platforms, d.Platform.String())
				if d.MediaType != types.OCIManifestSchema1 {
					t.Errorf("%s: media type %s", d.Platform, d.MediaType)
				}
				img, err := idx.Image(d.Digest)
				if err != nil {
					t.Fatal(err)
				}
				cf, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				configs = append(configs, cf)
				if cf.OS != d.Platform.OS || cf.Architecture != d.Platform.Architecture {
					t.Errorf("descriptor says %s, config says %s/%s", d.Platform, cf.OS, cf.Architecture)
				}
				f, err := elf.NewFile(bytes.NewReader(fileData(t, img, tt.binary)))
				if err != nil {
					t.Fatalf("%s: %s is not ELF: %v", d.Platform, tt.binary, err)
				}
				want, ok := machines[cf.Architecture]
				if !ok {
					t.Fatalf("no expected machine for %s", cf.Architecture)
				}
				if f.Machine != want || f.Type != elf.ET_EXEC || f.Class != elf.ELFCLASS64 {
					t.Errorf("%s: %s is %s %s %s, want %s ET_EXEC ELFCLASS64", d.Platform, tt.binary, f.Machine, f.Type, f.Class, want)
				}
				for _, p := range f.Progs {
					if p.Type == elf.PT_INTERP {
						t.Errorf("%s: %s has an interpreter: not a static binary", d.Platform, tt.binary)
					}
				}
				f.Close()
			}
			slices.Sort(platforms)
			if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
				t.Errorf("platforms %v, want %v", platforms, want)
			}
			for _, cf := range configs[1:] {
				if cf.Config.User != configs[0].Config.User || !slices.Equal(cf.Config.Entrypoint, configs[0].Config.Entrypoint) {
					t.Errorf("entries disagree: user %q/%q entrypoint %q/%q", cf.Config.User, configs[0].Config.User, cf.Config.Entrypoint, configs[0].Config.Entrypoint)
				}
				if cf.RootFS.DiffIDs[0] != configs[0].RootFS.DiffIDs[0] {
					t.Errorf("entries have different base layers")
				}
			}
		})
	}
}
