package krm

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
)

// TestPathsAreUniquePerInstance: kpt writes each object to the file and
// position its path and index annotations name, and fails when two objects
// claim the same pair. Instances that share a name (in different
// namespaces) or a directory must still get files of their own.
func TestPathsAreUniquePerInstance(t *testing.T) {
	prefetcher := func(ns, name, file string, index int) string {
		return fmt.Sprintf(`- apiVersion: image-prefetcher.stackrox.io/v1alpha1
  kind: ImagePrefetcher
  metadata:
    name: %s
    namespace: %s
    annotations:
      internal.config.kubernetes.io/path: '%s'
      internal.config.kubernetes.io/index: '%d'
      internal.config.kubernetes.io/seqindent: 'compact'
  spec:
    images: [debian:bookworm]
`, name, ns, file, index)
	}
	cases := []struct {
		name  string
		items string
		// files are the files of the output's objects, in order: under
		// kpt each intent stays, its expansion in a file next to it.
		files []string
	}{
		{
			name:  "same name, two namespaces, one file",
			items: prefetcher("team-1", "a", "prefetchers.yaml", 0) + prefetcher("team-2", "a", "prefetchers.yaml", 1),
			files: []string{"prefetchers.yaml", "image-prefetcher.team-1.a.yaml", "image-prefetcher.team-2.a.yaml"},
		},
		{
			name:  "same name, two namespaces, two files in one directory",
			items: prefetcher("team-1", "a", "apps/one.yaml", 0) + prefetcher("team-2", "a", "apps/two.yaml", 0),
			files: []string{"apps/one.yaml", "apps/image-prefetcher.team-1.a.yaml", "apps/two.yaml", "apps/image-prefetcher.team-2.a.yaml"},
		},
		{
			// Joined with '-', these two would both be image-prefetcher-a-b-c.
			name:  "names that run together",
			items: prefetcher("a-b", "c", "p.yaml", 0) + prefetcher("a", "b-c", "p.yaml", 1),
			files: []string{"p.yaml", "image-prefetcher.a-b.c.yaml", "image-prefetcher.a.b-c.yaml"},
		},
		{
			name: "next to other files of the package",
			items: "- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: team-1\n    annotations:\n      internal.config.kubernetes.io/path: 'ns.yaml'\n      internal.config.kubernetes.io/index: '0'\n" +
				prefetcher("team-1", "a", "dev/p.yaml", 0) + prefetcher("team-1", "b", "prod/p.yaml", 0),
			files: []string{"ns.yaml", "dev/p.yaml", "dev/image-prefetcher.team-1.a.yaml", "prod/p.yaml", "prod/image-prefetcher.team-1.b.yaml"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + tc.items
			out, results, err := Run([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if results.ExitCode() != 0 {
				t.Fatalf("error results: %v", results)
			}
			rl, err := fn.ParseResourceList(out)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			var files []string
			for _, it := range rl.Items {
				key := fmt.Sprintf("%s#%d", it.PathAnnotation(), it.IndexAnnotation())
				where := it.GetKind() + " " + strings.TrimPrefix(it.GetNamespace()+"/"+it.GetName(), "/")
				if prev, dup := seen[key]; dup {
					t.Errorf("%s and %s share path and index %s", prev, where, key)
				}
				seen[key] = where
				if !slices.Contains(files, it.PathAnnotation()) {
					files = append(files, it.PathAnnotation())
				}
			}
			if !slices.Equal(files, tc.files) {
				t.Errorf("files: got %q, want %q", files, tc.files)
			}
		})
	}
}
