package krm

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// TestPassThroughKeepsBytes feeds oddly formatted items around an
// ImagePrefetcher and checks that each unrelated item, with its comments,
// spacing, quoting, flow style, anchors and indentation, is in the output
// exactly as it was in the input.
func TestPassThroughKeepsBytes(t *testing.T) {
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
	text := string(in)
	first := text[strings.Index(text, "  # head comment of the first item"):strings.Index(text, "  # the ImagePrefetcher")]
	last := text[strings.Index(text, "  -\n    # the dash alone"):strings.Index(text, "# a comment before the functionConfig")]
	for name, chunk := range map[string]string{"first item": first, "last item": last} {
		if !strings.Contains(string(out), chunk) {
			t.Errorf("%s is not in the output byte for byte; want\n%s\ngot\n%s", name, chunk, out)
		}
	}
	if strings.Contains(string(out), "kind: ImagePrefetcher") {
		t.Errorf("the ImagePrefetcher item was not replaced:\n%s", out)
	}
	// The new items are written at the input's indentation, so the
	// output is still one valid ResourceList, in the input's order.
	var doc struct {
		Items []struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"items"`
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("output is not YAML: %v\n%s", err, out)
	}
	var kinds []string
	for _, it := range doc.Items {
		kinds = append(kinds, it.Kind)
	}
	want := "ConfigMap ServiceAccount ClusterRole ClusterRoleBinding Role RoleBinding ConfigMap DaemonSet ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding Secret"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("item order:\n got %s\nwant %s", got, want)
	}
}

// TestPassThroughWithoutPrefetcher: with nothing to expand, the items of
// the output are the items of the input, byte for byte.
func TestPassThroughWithoutPrefetcher(t *testing.T) {
	in := []byte(`apiVersion: config.kubernetes.io/v1
kind: ResourceList
items:
- apiVersion: v1
  kind: ConfigMap   # spacing
  metadata:
    name: a
  data: {x: "1",  y: '2'}
# between
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: b
`)
	out, _, err := Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, in) {
		t.Errorf("output differs from input:\n%s", out)
	}
}

// TestSpliceFallsBack: input the splicer cannot cut (flow-style items)
// still gives a correct, encoded ResourceList.
func TestSpliceFallsBack(t *testing.T) {
	in := []byte(`{"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList", "items": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]}`)
	out, _, err := Run(in)
	if err != nil {
		t.Fatal(err)
	}
	want := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- {\"apiVersion\": \"v1\", \"kind\": \"ConfigMap\", \"metadata\": {\"name\": \"a\"}}\n"
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
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
			if r.Severity == fn.Error && r.Field != nil {
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
