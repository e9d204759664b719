package krm

import (
	"math/rand"
	"os"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// TestMutatedInputs runs the pass-through property over a few hundred
// deterministic mutations of the odd-format input (lines dropped, doubled,
// re-indented, comments inserted): the output always parses, and its items
// are the input's.
func TestMutatedInputs(t *testing.T) {
	b, _ := os.ReadFile("testdata/passthrough.in.yaml")
	base := strings.Split(string(b), "\n")
	r := rand.New(rand.NewSource(1))
	checked := 0
	for n := 0; n < 400; n++ {
		lines := append([]string(nil), base...)
		for k := 0; k < 1+r.Intn(3); k++ {
			i := r.Intn(len(lines))
			switch r.Intn(5) {
			case 0:
				lines = append(lines[:i], lines[i+1:]...)
			case 1:
				lines = append(lines[:i+1], lines[i:]...)
			case 2:
				lines[i] = " " + lines[i]
			case 3:
				lines[i] = strings.TrimPrefix(lines[i], " ")
			case 4:
				lines = append(lines[:i], append([]string{strings.Repeat(" ", r.Intn(6)) + "# c"}, lines[i:]...)...)
			}
		}
		in := strings.Join(lines, "\n")
		want, err := fn.ParseResourceList([]byte(in))
		var strict any // no duplicate keys: YAML forbids them, kpt and kustomize refuse them
		if err != nil || yaml.Unmarshal([]byte(in), &strict) != nil {
			continue
		}
		out, res, err := Run([]byte(in))
		if err != nil {
			continue
		}
		checked++
		got, err := fn.ParseResourceList(out)
		if err != nil {
			t.Fatalf("output does not parse: %v\n%s\n----\n%s", err, in, out)
		}
		if res.ExitCode() != 0 {
			if len(got.Items) != len(want.Items) {
				t.Fatalf("an error result changed the items\n%s\n----\n%s", in, out)
			}
		}
		if res.ExitCode() == 0 {
			ip := false
			for _, it := range want.Items {
				if it.GetKind() == "ImagePrefetcher" {
					ip = true
				}
			}
			if ip {
				continue
			}
		}
		for i := range want.Items {
			if !sameNode(got.Items[i].CopyToResourceNode().YNode(), want.Items[i].CopyToResourceNode().YNode()) {
				t.Fatalf("item %d differs\n%s\n----\n%s", i, in, out)
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d of 400 mutations checked", checked)
	}
}
