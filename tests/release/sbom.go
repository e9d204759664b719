package release

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"sort"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// SBOMMediaType is the media type cosign gives a CycloneDX JSON SBOM
// (`cosign attach sbom --type cyclonedx`).
const SBOMMediaType types.MediaType = "application/vnd.cyclonedx+json"

// SBOM is a CycloneDX document of the Go modules linked into binaries, read
// from their build information (debug/buildinfo): the module graph as the
// linker resolved it, replacements applied, the Go standard library
// included. One document covers an image index: the per-platform binaries
// of one release link the same modules, and a module that only one of them
// links is listed too.
func SBOM(imageRef, version string, binaries ...string) ([]byte, error) {
	comps := map[string]cdx.Component{}
	for _, b := range binaries {
		bi, err := buildinfo.ReadFile(b)
		if err != nil {
			return nil, fmt.Errorf("read Go build information of %s: %w", b, err)
		}
		std := component("std", bi.GoVersion, "")
		comps[std.BOMRef] = std
		for _, m := range bi.Deps {
			if m.Replace != nil {
				m = m.Replace
			}
			c := component(m.Path, m.Version, m.Sum)
			comps[c.BOMRef] = c
		}
	}
	refs := make([]string, 0, len(comps))
	for ref := range comps {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	list := make([]cdx.Component, 0, len(refs))
	for _, ref := range refs {
		list = append(list, comps[ref])
	}
	main := cdx.Component{
		BOMRef:  imageRef,
		Type:    cdx.ComponentTypeContainer,
		Name:    imageRef,
		Version: version,
	}
	bom := cdx.NewBOM()
	bom.Metadata = &cdx.Metadata{Component: &main}
	bom.Components = &list
	bom.Dependencies = &[]cdx.Dependency{{Ref: main.BOMRef, Dependencies: &refs}}
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		return nil, fmt.Errorf("encode SBOM: %w", err)
	}
	return buf.Bytes(), nil
}

// component is one Go module, named by its package URL (purl-spec's golang
// type), with the go.sum hash as a property: CycloneDX has no h1 algorithm.
func component(path, version, sum string) cdx.Component {
	purl := "pkg:golang/" + path + "@" + version
	c := cdx.Component{BOMRef: purl, Type: cdx.ComponentTypeLibrary, Name: path, Version: version, PackageURL: purl}
	if sum != "" {
		c.Properties = &[]cdx.Property{{Name: "go.sum", Value: sum}}
	}
	return c
}

// AttachSBOM pushes sbom as cosign's attachment of d: the sha256-<hex>.sbom
// tag (`cosign download sbom` reads it, `cosign copy` mirrors it).
func AttachSBOM(ctx context.Context, d name.Digest, sbom []byte, opts ...remote.Option) error {
	img, err := attachment(sbom, SBOMMediaType, nil)
	if err != nil {
		return err
	}
	tag := AttachmentTag(d, "sbom")
	if err := remote.Write(tag, img, append([]remote.Option{remote.WithContext(ctx)}, opts...)...); err != nil {
		return fmt.Errorf("push SBOM %s: %w", tag, err)
	}
	return nil
}
