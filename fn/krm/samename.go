package krm

import (
	"fmt"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// sameNames finds instances that share a metadata.name. Their object names
// differ, but the node key image-prefetcher.stackrox.io/<name> is the same
// whatever their namespaces, and only one of them can own it on a node
// (the agent of the other fails with InstanceConflict). What the function
// sees is refused here, naming both: instances in this run, and under
// kustomize those a lower layer rendered, known by the rendered-for mark
// (kpt re-renders or removes what it rendered before). Two renamed copies
// of one rendering (a namePrefix or nameSuffix above it) share one
// instance in the same way, and are refused too.
func sameNames(exps []*expansion, items []*yaml.RNode, kpt bool) framework.Results {
	var results framework.Results
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
	daemonSets := map[instance]*yaml.RNode{} // one per rendering
	reported := map[instance]bool{}
	for _, it := range items {
		owner, ok := ownerOf(it)
		if !ok || reported[owner] {
			continue
		}
		if src := first[owner.name]; !kpt && src != nil && instanceOf(src) != owner {
			reported[owner] = true
			results = append(results, conflict(src, fmt.Sprintf(
				"%s has the name of ImagePrefetcher %s, which a lower layer rendered (%s carries %s: %s): instances of one name share the node label and annotation %s, whatever their namespaces, so each instance needs a name of its own",
				idOf(src), owner, idOf(it), RenderedForAnnotation, owner, v1alpha1.NodeKey(owner.name))))
			continue
		}
		if it.GetKind() != "DaemonSet" {
			continue
		}
		if prev, dup := daemonSets[owner]; dup && prev.GetName() != it.GetName() {
			reported[owner] = true
			results = append(results, &framework.Result{Severity: framework.Error, ResourceRef: refOf(it), File: fileOf(it), Field: &framework.Field{Path: "metadata.name"}, Message: fmt.Sprintf(
				"%s and %s are both what image-prefetcher-fn rendered for ImagePrefetcher %s, renamed after rendering (namePrefix or nameSuffix): the copies share that instance's node key %s and admission policy, and their agents overwrite each other's list; give each copy an ImagePrefetcher of its own name and render it there",
				idOf(prev), idOf(it), owner, v1alpha1.NodeKey(owner.name))})
		}
		daemonSets[owner] = it
	}
	return results
}
