package main

import (
	"testing"
)

// TestKustomizeMetadataReachesEveryObject: in the transformer setup the
// docs recommend, kustomize's commonAnnotations (an Argo CD sync wave) and
// labels (a Flux label) next to the function, and a label patched onto the
// ImagePrefetcher in the overlay, reach every object the function renders
// and the pod template; the user's part-of wins, the function's name,
// instance and managed-by win, and the DaemonSet selector does not move.
func TestKustomizeMetadataReachesEveryObject(t *testing.T) {
	dir := writeTree(t, merge(base, overlay("prod", `namespace: prod
commonAnnotations:
  argocd.argoproj.io/sync-wave: "-1"
labels:
- pairs:
    toolkit.fluxcd.io/tenant: platform-team
    app.kubernetes.io/managed-by: kustomize
patches:
- target:
    kind: ImagePrefetcher
  patch: |
    apiVersion: image-prefetcher.stackrox.io/v1alpha1
    kind: ImagePrefetcher
    metadata:
      name: demo
      labels:
        app.kubernetes.io/part-of: platform-tools
`)))
	m := kustomize(t, dir+"/prod")
	rendered := 0
	for _, r := range m.Resources() {
		l, a := r.GetLabels(), r.GetAnnotations()
		if l["app.kubernetes.io/name"] != "image-prefetcher" {
			continue // the input ConfigMap of the list
		}
		rendered++
		id := r.GetKind() + " " + r.GetName()
		if a["argocd.argoproj.io/sync-wave"] != "-1" {
			t.Errorf("%s: annotations %v lack the sync wave", id, a)
		}
		want := map[string]string{
			"toolkit.fluxcd.io/tenant":     "platform-team",
			"app.kubernetes.io/part-of":    "platform-tools",
			"app.kubernetes.io/managed-by": "image-prefetcher-fn",
			"app.kubernetes.io/instance":   "demo",
		}
		for k, v := range want {
			if l[k] != v {
				t.Errorf("%s: label %s = %q, want %q", id, k, l[k], v)
			}
		}
	}
	if rendered < 7 {
		t.Errorf("only %d rendered objects found", rendered)
	}
	ds := find(t, m, "DaemonSet", "image-prefetcher-demo")
	if got := field(t, ds, "spec", "selector", "matchLabels"); got != "app.kubernetes.io/instance: demo\napp.kubernetes.io/name: image-prefetcher" {
		t.Errorf("selector moved:\n%s", got)
	}
	if got := field(t, ds, "spec", "template", "metadata", "annotations", "argocd.argoproj.io/sync-wave"); got != `"-1"` {
		t.Errorf("pod template sync wave %q", got)
	}
	if got := field(t, ds, "spec", "template", "metadata", "labels", "toolkit.fluxcd.io/tenant"); got != "platform-team" {
		t.Errorf("pod template tenant label %q", got)
	}
}
