package krm

import (
	"os"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// TestPassThroughKeepsItems feeds oddly formatted items around an
// ImagePrefetcher: each unrelated item keeps its data and comments, and
// the items keep their order, the expansion in place of the
// ImagePrefetcher. (kpt and kustomize re-encode what a function writes, so
// its own formatting never reaches a file.)
func TestPassThroughKeepsItems(t *testing.T) {
	in, err := os.ReadFile("testdata/passthrough.in.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, results, err := Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if results.ExitCode() != 0 {
		t.Fatalf("unexpected error results: %v", results)
	}
	want, got := parseItems(t, in), parseItems(t, out)
	var kinds []string
	for _, it := range got {
		kinds = append(kinds, it.GetKind())
	}
	if got, want := strings.Join(kinds, " "), "ConfigMap ServiceAccount ClusterRole ClusterRoleBinding Role RoleBinding ConfigMap DaemonSet ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding Secret"; got != want {
		t.Fatalf("item order:\n got %s\nwant %s", got, want)
	}
	if !sameNode(got[0].YNode(), want[0].YNode()) || !sameNode(got[len(got)-1].YNode(), want[len(want)-1].YNode()) {
		t.Errorf("a passed-through item changed:\n%s", out)
	}
}

// TestPassThroughWithoutPrefetcher: with nothing to expand, the items of
// the output are the items of the input, block or flow (JSON) style.
func TestPassThroughWithoutPrefetcher(t *testing.T) {
	for _, in := range []string{
		"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- apiVersion: v1\n  kind: ConfigMap   # spacing\n  metadata:\n    name: a\n  data: {x: \"1\",  y: '2'}\n# between\n- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: b\n",
		`{"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList", "items": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]}`,
	} {
		out, _, err := Run([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		want, got := parseItems(t, []byte(in)), parseItems(t, out)
		if len(got) != len(want) {
			t.Fatalf("%d items out, %d in:\n%s", len(got), len(want), out)
		}
		for i := range want {
			if !sameNode(got[i].YNode(), want[i].YNode()) {
				t.Errorf("item %d changed:\n%s", i, out)
			}
		}
	}
}

func parseItems(t *testing.T, rl []byte) []*yaml.RNode {
	t.Helper()
	l, err := fn.ParseResourceList(rl)
	if err != nil {
		t.Fatalf("not a ResourceList: %v\n%s", err, rl)
	}
	var items []*yaml.RNode
	for _, ko := range l.Items {
		items = append(items, ko.CopyToResourceNode())
	}
	return items
}

// TestRenderedAnnotationsLimit: the user's annotations are copied onto
// every rendered object next to the function's own, and the apiserver
// limits them together; user annotations that fit alone but not with the
// function's are an error at metadata.annotations.
func TestRenderedAnnotationsLimit(t *testing.T) {
	for _, tc := range []struct {
		under int // bytes the user's annotations stay under 256 KiB
		fails bool
	}{{40, true}, {2048, false}} {
		key := "example.com/big"
		value := strings.Repeat("x", 256<<10-tc.under-len(key))
		in := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: web\n    namespace: team-a\n    annotations:\n      " + key + ": " + value + "\n  spec:\n    images: [debian:bookworm]\n"
		_, results, err := Run([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, r := range results {
			if r.Severity == framework.Error && r.Field != nil {
				paths = append(paths, r.Field.Path)
			}
		}
		if got := len(paths) > 0; got != tc.fails {
			t.Errorf("%d bytes under the limit: errors at %v, want failure %v", tc.under, paths, tc.fails)
		}
		for _, p := range paths {
			if p != "metadata.annotations" {
				t.Errorf("%d bytes under the limit: error at %s, want metadata.annotations", tc.under, p)
			}
		}
	}
}
