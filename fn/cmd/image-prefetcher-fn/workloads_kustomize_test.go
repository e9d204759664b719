package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// shop is a kustomization of an app and an ImagePrefetcher that reads its
// images from the app, with the function as a transformer.
var shop = map[string]string{
	"shop/kustomization.yaml": `resources:
- app.yaml
- prefetcher.yaml
transformers:
- fn.yaml
`,
	"shop/fn.yaml": fnTransformer,
	"shop/prefetcher.yaml": `apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: shop
  namespace: prefetch
spec:
  imageListFrom:
    workloads:
    - kind: Deployment
      name: web
`,
	"shop/app.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: ghcr.io/example/web:1.0
`,
}

// listOf is the rendered list of instance name, without comments.
func listOf(t *testing.T, dir, cm string) (list, deployed string) {
	t.Helper()
	m := kustomize(t, dir)
	var refs []string
	for _, l := range strings.Split(find(t, m, "ConfigMap", cm).GetDataMap()["images.txt"], "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			refs = append(refs, l)
		}
	}
	return strings.Join(refs, " "), field(t, find(t, m, "Deployment", ""), "spec", "template", "spec", "containers", "[name=web]", "image")
}

// kustomize runs builtin transformers before the functions of the same
// kustomization: the function reads the workloads after images:,
// namespace: and namePrefix:, and selects by the original name too.
func TestKustomizeWorkloadsAfterBuiltins(t *testing.T) {
	for _, tc := range []struct {
		name, extra, cm  string
		list, deployedAs string
	}{
		{name: "as written", cm: "image-prefetcher-shop-images",
			list: "ghcr.io/example/web:1.0", deployedAs: "ghcr.io/example/web:1.0"},
		{name: "images: in the same kustomization", cm: "image-prefetcher-shop-images",
			extra: "images:\n- name: ghcr.io/example/web\n  newTag: \"2.0\"\n",
			list:  "ghcr.io/example/web:2.0", deployedAs: "ghcr.io/example/web:2.0"},
		{name: "images: with a new name and a digest", cm: "image-prefetcher-shop-images",
			extra: "images:\n- name: ghcr.io/example/web\n  newName: registry.example.com/mirror/web\n  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
			list:  "registry.example.com/mirror/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", deployedAs: "registry.example.com/mirror/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{name: "namePrefix: the selector matches the original name", cm: "image-prefetcher-team-shop-images",
			extra: "namePrefix: team-\n",
			list:  "ghcr.io/example/web:1.0", deployedAs: "ghcr.io/example/web:1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := merge(shop)
			files["shop/kustomization.yaml"] += tc.extra
			list, deployed := listOf(t, filepath.Join(writeTree(t, files), "shop"), tc.cm)
			if list != tc.list || deployed != tc.deployedAs {
				t.Errorf("list %q, deployed %q; want list %q, deployed %q", list, deployed, tc.list, tc.deployedAs)
			}
		})
	}
}

// The pitfall docs/staged-rollouts.md warns about: an images: in a
// kustomization above the function's runs after the list was made, so the
// cluster would run a tag the nodes were never given.
func TestKustomizeImagesAboveTheFunctionAreNotSeen(t *testing.T) {
	files := merge(shop, map[string]string{
		"release/kustomization.yaml": "resources:\n- ../shop\nimages:\n- name: ghcr.io/example/web\n  newTag: \"2.0\"\n",
	})
	list, deployed := listOf(t, filepath.Join(writeTree(t, files), "release"), "image-prefetcher-shop-images")
	if list != "ghcr.io/example/web:1.0" || deployed != "ghcr.io/example/web:2.0" {
		t.Errorf("list %q, deployed %q; the overlay's images: is expected to reach the workload only", list, deployed)
	}
}
