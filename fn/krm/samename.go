package krm

import (
	"fmt"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// sameNames finds instances that share a metadata.name. Their object names
// differ, but the node key image-prefetcher.stackrox.io/<name> is the same
// whatever their namespaces, and only one of them can own it on a node
// (the agent of the other fails with InstanceConflict). What the function
// sees in one ResourceList is refused here, naming both.
func sameNames(exps []*expansion) fn.Results {
	var results fn.Results
	first := map[string]*yaml.RNode{}
	for _, e := range exps {
		name := e.source.GetName()
		prev, dup := first[name]
		if !dup {
			first[name] = e.source
			continue
		}
		if prev.GetNamespace() == e.source.GetNamespace() {
			continue // one identity twice: the rendered objects clash, and say so
		}
		results = append(results, conflict(e.source, fmt.Sprintf(
			"%s has the name of %s: instances of one name share the node label and annotation %s, whatever their namespaces, so each instance needs a name of its own",
			idOf(e.source), idOf(prev), v1alpha1.NodeKey(name))))
	}
	return results
}
