package main

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

func TestOrigins(t *testing.T) {
	root := t.TempDir()
	for p, content := range map[string]string{
		"top/kustomization.yaml":  "resources:\n- ../base\n- local.yaml\n- ../loop\n",
		"top/local.yaml":          "kind: ImagePrefetcher\nmetadata:\n  name: local\n  namespace: a\n",
		"base/kustomization.yaml": "resources:\n- two.yaml\n",
		"base/two.yaml":           "kind: ImagePrefetcher\nmetadata:\n  name: first\n  namespace: a\n---\nkind: ConfigMap\nmetadata:\n  name: list\n",
		// A kustomization that includes the top one again.
		"loop/kustomization.yaml": "resources:\n- ../top\n- late.yaml\n",
		"loop/late.yaml":          "kind: ImagePrefetcher\nmetadata:\n  name: local\n  namespace: b\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files := &origins{dir: filepath.Join(root, "top")}
	for _, tc := range []struct {
		kind, namespace, name string
		want                  string
	}{
		{"ImagePrefetcher", "a", "first", "../base/two.yaml"},
		{"ImagePrefetcher", "a", "local", "local.yaml"},
		{"ImagePrefetcher", "b", "local", "../loop/late.yaml"},
		// Declared without a namespace: a namespace: above set it.
		{"ConfigMap", "a", "list", "../base/two.yaml"},
		{"ImagePrefetcher", "c", "first", ""},
		{"ConfigMap", "a", "other", ""},
	} {
		ref := &yaml.ResourceIdentifier{TypeMeta: yaml.TypeMeta{Kind: tc.kind}, NameMeta: yaml.NameMeta{Namespace: tc.namespace, Name: tc.name}}
		if got := files.of(ref); got != tc.want {
			t.Errorf("%s %s/%s: %q, want %q", tc.kind, tc.namespace, tc.name, got, tc.want)
		}
	}
}
