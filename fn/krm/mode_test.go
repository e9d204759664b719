package krm

import (
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

func nodes(t *testing.T, docs ...string) []*yaml.RNode {
	t.Helper()
	var out []*yaml.RNode
	for _, d := range docs {
		n, err := yaml.Parse(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

const (
	ipDoc   = "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata: {name: demo, namespace: prefetch}\nspec: {images: [debian]}\n"
	echoDoc = "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata: {name: demo, namespace: prefetch, annotations: {config.kubernetes.io/local-config: 'true'}}\nspec: {images: [debian]}\n"
	oursDoc = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: image-prefetcher-demo, namespace: prefetch, labels: {app.kubernetes.io/managed-by: image-prefetcher-fn, app.kubernetes.io/instance: demo}, annotations: {image-prefetcher.stackrox.io/rendered-for: prefetch/demo}}\n"
	otherIP = "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata: {name: other, namespace: prefetch}\nspec: {images: [debian]}\n"
	nsDoc   = "apiVersion: v1\nkind: Namespace\nmetadata: {name: prefetch}\n"
)

// TestInvokedAsGenerator: only what kustomize sends a generator (its config
// echoed as the one local-config item), no items, or the function's own
// output for that config count as a generator call.
func TestInvokedAsGenerator(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items []string
		want  bool
	}{
		{"kustomize's echo", []string{echoDoc}, true},
		{"no items", nil, true},
		{"own output fed back", []string{oursDoc}, true},
		{"the same ImagePrefetcher as a resource, not local-config", []string{ipDoc}, false},
		{"another ImagePrefetcher (transformers:)", []string{otherIP}, false},
		{"echo and other resources", []string{echoDoc, nsDoc}, false},
		{"a resource", []string{nsDoc}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := invokedAsGenerator(nodes(t, tc.items...), nodes(t, ipDoc)[0]); got != tc.want {
				t.Errorf("invokedAsGenerator = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTypoErrors: a kind of the API group the function does not know, or
// an ImagePrefetcher under another group, is an error at the field to
// change; the function's own kind and unrelated objects are not. As a
// generator's configuration (kustomize's echo of it the only item) the
// message says that nothing is rendered, not that applying fails.
func TestTypoErrors(t *testing.T) {
	const typo = "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: Imageprefetcher\nmetadata: {name: x}\n"
	echo := strings.Replace(typo, "{name: x}", "{name: x, annotations: {config.kubernetes.io/local-config: 'true'}}", 1)
	for _, tc := range []struct {
		doc, fc     string
		want, field string // want "" for no error
	}{
		{ipDoc, "", "", ""},
		{nsDoc, "", "", ""},
		{typo, "", `"Imageprefetcher" is not a kind of image-prefetcher.stackrox.io: this object is not expanded`, "kind"},
		{echo, typo, `"Imageprefetcher" is not a kind of image-prefetcher.stackrox.io: the function's configuration is not an ImagePrefetcher, so nothing is rendered`, "kind"},
		{"apiVersion: image-prefetcher.stackrox.io/v1\nkind: Prefetcher\nmetadata: {name: x}\n", "", `"Prefetcher" is not a kind of`, "kind"},
		{"apiVersion: image-prefetch.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata: {name: x}\n", "", `"image-prefetch.stackrox.io/v1alpha1" is not image-prefetcher.stackrox.io/v1alpha1`, "apiVersion"},
		{"apiVersion: v1alpha1\nkind: imageprefetcher\nmetadata: {name: x}\n", "", `"v1alpha1" is not`, "apiVersion"},
		{"apiVersion: example.com/v1\nkind: ImagePrefetcher\nmetadata: {name: x}\n", "", "", ""}, // someone else's kind of that name
	} {
		var fc *yaml.RNode
		if tc.fc != "" {
			fc = nodes(t, tc.fc)[0]
		}
		rs := typoErrors(nodes(t, tc.doc), fc, false)
		switch {
		case tc.want == "" && len(rs) > 0:
			t.Errorf("%q: unexpected error %q", tc.doc, rs[0].Message)
		case tc.want != "" && (len(rs) != 1 || !strings.Contains(rs[0].Message, tc.want) || rs[0].Field.Path != tc.field || rs[0].Severity != "error"):
			t.Errorf("%q: got %+v, want one error at %s containing %q", tc.doc, rs, tc.field, tc.want)
		}
	}
}

// TestSelectionRefused: a kpt run whose items carry kpt's selection id (a
// step with selectors: or exclude:) is refused with one error that names
// the fix, before anything is rendered or removed; a kpt run of the whole
// package and a kustomize run are not.
func TestSelectionRefused(t *testing.T) {
	const kptMarks = "internal.config.kubernetes.io/seqindent: compact, config.kubernetes.io/path: prefetcher.yaml"
	selected := func(doc, id string) string {
		return strings.Replace(doc, "prefetch}", "prefetch, annotations: {"+kptMarks+", internal.config.k8s.io/kpt-resource-id: '"+id+"'}}", 1)
	}
	whole := strings.Replace(ipDoc, "prefetch}", "prefetch, annotations: {"+kptMarks+"}}", 1)
	ours := strings.Replace(oursDoc, "prefetch/demo}", "prefetch/demo, "+kptMarks+", internal.config.k8s.io/kpt-resource-id: '1'}", 1)
	for _, tc := range []struct {
		name    string
		items   []string
		refused bool
	}{
		{"selectors: the ImagePrefetcher only", []string{selected(ipDoc, "0")}, true},
		{"selectors: the rendered objects only", []string{ours}, true},
		{"kpt, the whole package", []string{whole, strings.Replace(oursDoc, "prefetch/demo}", "prefetch/demo, "+kptMarks+"}", 1)}, false},
		{"kustomize", []string{ipDoc, nsDoc}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n"
			for _, d := range tc.items {
				in += "- " + strings.ReplaceAll(strings.TrimSpace(d), "\n", "\n  ") + "\n"
			}
			out, results, err := Run([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			var refusals []string
			for _, r := range results {
				if r.Severity == "error" && strings.Contains(r.Message, "remove selectors: and exclude: from the image-prefetcher-fn step") {
					refusals = append(refusals, r.Message)
				}
			}
			switch {
			case tc.refused && (len(results) != 1 || len(refusals) != 1):
				t.Errorf("results %v, want the one refusal", results)
			case tc.refused && strings.Contains(string(out), "kind: DaemonSet"):
				t.Errorf("rendered despite the refusal:\n%s", out)
			case tc.refused && strings.Count(string(out), "\n- apiVersion: ") != len(tc.items):
				t.Errorf("the refused run did not give its items back as they were:\n%s", out)
			case !tc.refused && len(refusals) > 0:
				t.Errorf("refused a run that sees the whole package: %v", refusals)
			}
		})
	}
}
