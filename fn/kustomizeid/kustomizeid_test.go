package kustomizeid

import (
	"slices"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

func TestIdentities(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations []string
		// prev are the earlier namespace/name pairs, orig the original one.
		prev []string
		orig string
	}{
		{name: "never renamed", orig: "shop/prod-web"},
		{
			name: "renamed twice, as kustomize v5 writes it",
			annotations: []string{
				"internal.config.kubernetes.io/previousNames: web,dev-web",
				"internal.config.kubernetes.io/previousNamespaces: default,dev",
				"internal.config.kubernetes.io/previousKinds: Deployment,Deployment",
			},
			prev: []string{"default/web", "dev/dev-web"},
			orig: "default/web",
		},
		{
			name:        "annotations that disagree: never renamed",
			annotations: []string{"internal.config.kubernetes.io/previousNames: web,dev-web"},
			orig:        "shop/prod-web",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: prod-web\n  namespace: shop\n"
			if len(tc.annotations) > 0 {
				text += "  annotations:\n"
				for _, a := range tc.annotations {
					text += "    " + a + "\n"
				}
			}
			n := yaml.MustParse(text)
			got := Current(n)
			if got.Namespace+"/"+got.Name != "shop/prod-web" || got.Kind != "Deployment" || got.Group != "apps" {
				t.Errorf("Current = %v", got)
			}
			var prev []string
			for _, id := range Previous(n) {
				if id.Kind != "Deployment" {
					t.Errorf("previous kind %q", id.Kind)
				}
				prev = append(prev, id.Namespace+"/"+id.Name)
			}
			if !slices.Equal(prev, tc.prev) {
				t.Errorf("Previous = %q, want %q", prev, tc.prev)
			}
			if got := Original(n); got.Namespace+"/"+got.Name != tc.orig {
				t.Errorf("Original = %v, want %s", got, tc.orig)
			}
		})
	}
}
