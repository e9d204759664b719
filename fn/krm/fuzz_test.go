package krm

import (
	"os"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// FuzzPassThrough: whatever the formatting of the items, the output of a
// run with nothing to expand parses back to the same items, comments
// included.
func FuzzPassThrough(f *testing.F) {
	if b, err := os.ReadFile("testdata/passthrough.in.yaml"); err == nil {
		f.Add(string(b))
	}
	f.Add("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- apiVersion: v1\n  kind: ConfigMap # c\n  metadata:\n    name: a\n  data: {x: \"1\"}\n# between\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: b}\n")
	f.Add("kind: ResourceList\nitems:\n  -\n    kind: A\n    data: |\n      # not a comment\n      - not an item\n\n  - kind: B\n# tail\nfunctionConfig: {kind: X}\n")
	f.Add("kind: ResourceList\nitems:\n- &a {kind: A}\n- kind: B\n  ref: *a\n")
	f.Fuzz(func(t *testing.T, in string) {
		rl, err := fn.ParseResourceList([]byte(in))
		if err != nil {
			return
		}
		for _, it := range rl.Items {
			if isPrefetcher(it.CopyToResourceNode()) {
				return
			}
		}
		want, err := fn.ParseResourceList([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := Run([]byte(in))
		if err != nil {
			return // e.g. an item the encoder cannot write
		}
		got, err := fn.ParseResourceList(out)
		if err != nil {
			t.Fatalf("output does not parse: %v\n--- input\n%s\n--- output\n%s", err, in, out)
		}
		if len(got.Items) != len(want.Items) {
			t.Fatalf("%d items out, %d in\n--- input\n%s\n--- output\n%s", len(got.Items), len(want.Items), in, out)
		}
		for i := range want.Items {
			if !sameNode(got.Items[i].CopyToResourceNode().YNode(), want.Items[i].CopyToResourceNode().YNode()) {
				t.Fatalf("item %d differs\n--- input\n%s\n--- output\n%s", i, in, out)
			}
		}
	})
}

// sameNode compares data and comments, not presentation (quoting, flow
// or block style, indentation).
func sameNode(a, b *yaml.Node) bool {
	if a.Kind != b.Kind || len(a.Content) != len(b.Content) ||
		strings.TrimSpace(a.HeadComment) != strings.TrimSpace(b.HeadComment) ||
		strings.TrimSpace(a.LineComment) != strings.TrimSpace(b.LineComment) ||
		strings.TrimSpace(a.FootComment) != strings.TrimSpace(b.FootComment) {
		return false
	}
	switch a.Kind {
	case yaml.ScalarNode:
		return a.Value == b.Value && a.ShortTag() == b.ShortTag()
	case yaml.AliasNode:
		return a.Alias != nil && b.Alias != nil && a.Alias.Anchor == b.Alias.Anchor
	}
	for i := range a.Content {
		if !sameNode(a.Content[i], b.Content[i]) {
			return false
		}
	}
	return true
}
