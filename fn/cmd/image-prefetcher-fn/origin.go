package main

import (
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// origins finds the files that declare objects among the resources of the
// kustomization in a directory and the kustomizations it includes.
// kustomize passes a transformer no file names (only buildMetadata:
// [originAnnotations] would add them) and shows a function's stderr alone;
// it runs an exec function in the directory of the kustomization that
// lists it, so the function looks there. A resource renamed on the way up
// (namePrefix, namespace:) is not found.
type origins struct {
	dir   string
	decls []declaration // in kustomize's order; read at the first lookup
	read  bool
}

// declaration is one object of a resource file.
type declaration struct {
	file                  string // relative to the origins' directory
	kind, namespace, name string
}

// of returns the first file that declares ref, relative to the directory,
// or "". Every file is read once, however many results ask: a run that
// finds an error in each of hundreds of objects asks for each.
func (o *origins) of(ref *yaml.ResourceIdentifier) string {
	if !o.read {
		o.read = true
		o.walk(o.dir, map[string]bool{})
	}
	for _, d := range o.decls {
		if d.kind == ref.Kind && d.name == ref.Name && (d.namespace == "" || d.namespace == ref.Namespace) {
			return d.file
		}
	}
	return ""
}

// walk records the declarations of the kustomization in d, depth first in
// the order of its resources, as kustomize reads them.
func (o *origins) walk(d string, seen map[string]bool) {
	if seen[d] {
		return
	}
	seen[d] = true
	var k struct {
		Resources []string `yaml:"resources"`
	}
	for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		b, err := os.ReadFile(filepath.Join(d, name))
		if err == nil {
			if yaml.Unmarshal(b, &k) != nil {
				return
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
			o.walk(p, seen)
		default:
			o.file(p)
		}
	}
}

// file records the objects the YAML file p declares.
func (o *origins) file(p string) {
	b, err := os.ReadFile(p)
	if err != nil {
		return
	}
	nodes, err := kio.FromBytes(b)
	if err != nil {
		return
	}
	rel, err := filepath.Rel(o.dir, p)
	if err != nil {
		rel = p
	}
	for _, n := range nodes {
		o.decls = append(o.decls, declaration{file: rel, kind: n.GetKind(), namespace: n.GetNamespace(), name: n.GetName()})
	}
}
