package examples_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestKustomizeBuildMetadata: kustomize's buildMetadata writes how each
// object was built onto it (originAnnotations: the file it came from;
// transformerAnnotations: every builtin transformer that touched it, with
// the kustomization it is configured in). Those annotations are on the
// ImagePrefetcher when the function runs. The pod template must not carry
// them, or its config hash depend on them: moving a file, or turning
// buildMetadata on, would roll every agent of the cluster. The same intent
// in two source layouts, with and without buildMetadata, renders the same
// pod template, in transformer and in generator mode.
func TestKustomizeBuildMetadata(t *testing.T) {
	tl := findTools(t)
	const prefetcher = `apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: web
  namespace: prefetch
  annotations:
    example.com/team: web
spec:
  images: [registry.k8s.io/pause:3.10]
`
	// Builtin transformers in the base and in the overlay, so that the
	// ImagePrefetcher carries transformation records from both.
	const patch = `patches:
- target: {kind: ImagePrefetcher}
  patch: |
    - op: add
      path: /spec/images/-
      value: docker.io/library/busybox:1.37
`
	const buildMetadata = "buildMetadata: [originAnnotations, transformerAnnotations, managedByLabel]\n"
	overlay := func(base string, metadata bool) string {
		k := "resources: [" + base + "]\nnamespace: team-a\nnamePrefix: a-\nlabels:\n- pairs: {team: a}\n" + patch + "transformers: [fn.yaml]\n"
		if metadata {
			k += buildMetadata
		}
		return k
	}
	annotated := strings.Replace(prefetcher, "  annotations:\n", "  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: image-prefetcher-fn\n", 1)
	root := t.TempDir()
	for name, content := range map[string]string{
		// Layout one.
		"one/base/kustomization.yaml":  "resources: [prefetcher.yaml]\ncommonAnnotations:\n  example.com/owner: platform\n",
		"one/base/prefetcher.yaml":     prefetcher,
		"one/dev/kustomization.yaml":   overlay("../base", true),
		"one/dev/fn.yaml":              execFunction,
		"one/plain/kustomization.yaml": overlay("../base", false),
		"one/plain/fn.yaml":            execFunction,
		// The same files, moved and renamed.
		"two/intent/prefetch/kustomization.yaml":  "resources: [web-prefetcher.yaml]\ncommonAnnotations:\n  example.com/owner: platform\n",
		"two/intent/prefetch/web-prefetcher.yaml": prefetcher,
		"two/envs/team-a/kustomization.yaml":      overlay("../../intent/prefetch", true),
		"two/envs/team-a/fn.yaml":                 execFunction,
		// Generator mode.
		"gen/plain/kustomization.yaml": "generators: [prefetcher.yaml]\n",
		"gen/plain/prefetcher.yaml":    annotated,
		"gen/moved/kustomization.yaml": "generators: [generator.yaml]\n" + buildMetadata,
		"gen/moved/generator.yaml":     annotated,
	} {
		write(t, filepath.Join(root, name), content)
	}

	template := func(dir string) (string, *unstructured.Unstructured) {
		t.Helper()
		out := tl.run(t, root, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", dir)
		ds := only(t, decodeObjects(t, out), "DaemonSet")
		tmpl, found, err := unstructured.NestedMap(ds.Object, "spec", "template")
		if err != nil || !found {
			t.Fatalf("%s: DaemonSet without a pod template: %v", dir, err)
		}
		b, err := json.MarshalIndent(tmpl, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		return string(b), ds
	}
	for _, group := range [][]string{{"one/plain", "one/dev", "two/envs/team-a"}, {"gen/plain", "gen/moved"}} {
		want, ds := template(group[0])
		if ann := ds.GetAnnotations(); group[0] == "one/plain" && ann["example.com/owner"] != "platform" {
			t.Errorf("%s: the user's annotations %v did not reach the DaemonSet", group[0], ann)
		}
		for _, dir := range group[1:] {
			got, ds := template(dir)
			recorded := false
			for k := range ds.GetAnnotations() {
				recorded = recorded || strings.HasSuffix(strings.Split(k, "/")[0], "config.kubernetes.io")
			}
			if !recorded {
				t.Errorf("%s: kustomize recorded no build metadata on the DaemonSet; the case tests nothing", dir)
			}
			for k := range mustNestedStringMap(t, ds, "spec", "template", "metadata", "annotations") {
				if domain := strings.Split(k, "/")[0]; strings.HasSuffix(domain, "config.kubernetes.io") || strings.HasSuffix(domain, "config.k8s.io") {
					t.Errorf("%s: the pod template carries the tools' annotation %s", dir, k)
				}
			}
			if got != want {
				t.Errorf("%s renders another pod template than %s: every agent would roll:\n%s", dir, group[0], lineDiff([]byte(want), []byte(got)))
			}
		}
	}
}

func mustNestedStringMap(t *testing.T, o *unstructured.Unstructured, fields ...string) map[string]string {
	t.Helper()
	m, found, err := unstructured.NestedStringMap(o.Object, fields...)
	if err != nil || !found {
		t.Fatalf("%s %s: no string map at %v: %v", o.GetKind(), o.GetName(), fields, err)
	}
	return m
}
