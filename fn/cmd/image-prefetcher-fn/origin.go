package main

import (
	"os"
	"path/filepath"
	"slices"

	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// originOf finds the file that declares ref among the resources of the
// kustomization in dir and the kustomizations it includes, relative to
// dir, or "". kustomize passes a transformer no file names (only
// buildMetadata: [originAnnotations] would add them) and shows a
// function's stderr alone; it runs an exec function in the directory of
// the kustomization that lists it, so the function looks there. A
// resource renamed on the way up (namePrefix, namespace:) is not found.
func originOf(dir string, ref *yaml.ResourceIdentifier) string {
	seen := map[string]bool{}
	var walk func(d string) string
	walk = func(d string) string {
		if seen[d] {
			return ""
		}
		seen[d] = true
		var k struct {
			Resources []string `yaml:"resources"`
		}
		for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
			b, err := os.ReadFile(filepath.Join(d, name))
			if err == nil {
				if yaml.Unmarshal(b, &k) != nil {
					return ""
				}
				break
			}
		}
		for _, r := range k.Resources {
			p := filepath.Join(d, r)
			fi, err := os.Stat(p)
			switch {
			case err != nil:
			case fi.IsDir():
				if found := walk(p); found != "" {
					return found
				}
			case declares(p, ref):
				if rel, err := filepath.Rel(dir, p); err == nil {
					return rel
				}
				return p
			}
		}
		return ""
	}
	return walk(dir)
}

// declares tells whether the YAML file p holds the object ref names.
func declares(p string, ref *yaml.ResourceIdentifier) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	nodes, err := kio.FromBytes(b)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(nodes, func(n *yaml.RNode) bool {
		return n.GetKind() == ref.Kind && n.GetName() == ref.Name && (n.GetNamespace() == "" || n.GetNamespace() == ref.Namespace)
	})
}
