// Package kustomizeid reads an object's identities as kustomize keeps
// them: its current one and those it had before a namePrefix, nameSuffix
// or namespace: renamed it, which kustomize passes to a function in the
// internal.config.kubernetes.io/previousNames, previousNamespaces and
// previousKinds annotations. kustomize's own resource package reads them.
package kustomizeid

import (
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/resid"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Current is n's identity now.
func Current(n *yaml.RNode) resid.ResId {
	return (&resource.Resource{RNode: *n}).CurId()
}

// Previous is every identity n had before, oldest first, one per rename;
// none when n was never renamed. kustomize writes the three annotations
// together, one entry per rename each; where they disagree (written by
// hand), kustomize's reader panics, and n is taken as never renamed.
func Previous(n *yaml.RNode) (ids []resid.ResId) {
	defer func() {
		if recover() != nil {
			ids = nil
		}
	}()
	return (&resource.Resource{RNode: *n}).PrevIds()
}

// Original is the identity n had before any rename (kustomize's OrgId):
// kustomize's selectors match it as well as the current one.
func Original(n *yaml.RNode) resid.ResId {
	if prev := Previous(n); len(prev) > 0 {
		return prev[0]
	}
	return Current(n)
}
