package krm

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkRender is the whole function on a ResourceList whose
// ImagePrefetcher lists 2,000 images: parse, decode, validate, render,
// write. docs/api.md records its figure.
func BenchmarkRender(b *testing.B) {
	var in strings.Builder
	in.WriteString("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n")
	in.WriteString("- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: prefetch # kept as is\n")
	in.WriteString("- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: big\n    namespace: prefetch\n  spec:\n    images:\n")
	for i := range 2000 {
		fmt.Fprintf(&in, "    - registry.example.com/team-%d/app-%d:v1.%d.0\n", i%37, i, i%11)
	}
	input := []byte(in.String())
	for b.Loop() {
		out, results, err := Run(input)
		if err != nil || results.ExitCode() != 0 {
			b.Fatalf("err=%v results=%v", err, results)
		}
		if len(out) == 0 {
			b.Fatal("empty output")
		}
	}
}
