package krm

import (
	"os"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
)

// FuzzPassThrough: whatever the formatting of the items, the output of a
// run with nothing to expand parses back to the same items, comments
// included; the splicer either gets it exactly right or falls back.
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
			return // e.g. an item the encoder cannot write; not a splice bug
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
