package krm

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/kustomizeid"
)

// invokedAsGenerator tells, from how the function was called, whether
// kustomize runs it as a generator. kustomize calls a generator with its
// config as the only item, marked local-config (kio runs nothing on an
// empty input), and a transformer with the resources of the kustomization.
// The functionConfig alone cannot tell: the same annotated ImagePrefetcher
// file may sit under generators: or under transformers:, and only a
// generator's ConfigMap may carry kustomize's needs-hash.
//
// Two more inputs count as a generator call: no items at all (a hand-made
// call), and a generator's own output fed back in (the objects this
// instance rendered, which are replaced), so that the function stays a
// fixed point of its own output.
func invokedAsGenerator(items []*yaml.RNode, fc *yaml.RNode) bool {
	for _, it := range items {
		echo := isPrefetcher(it) && idOf(it) == idOf(fc) && it.GetAnnotations()[localConfig] == "true"
		owner, rendered := ownerOf(it)
		ours := rendered && owner == instanceOf(fc)
		if !echo && !ours {
			return false
		}
	}
	return true
}

// expandConfig expands an ImagePrefetcher functionConfig of a kustomize
// transformer (an annotated ImagePrefetcher under transformers:): it
// declares an instance like a generator's does, unless the same object is
// also among the resources, which are expanded already.
func expandConfig(fc *yaml.RNode, items []*yaml.RNode, expand func(*yaml.RNode) *expansion) *expansion {
	if fc == nil || !isPrefetcher(fc) || slices.ContainsFunc(items, func(it *yaml.RNode) bool { return idOf(it) == idOf(fc) }) {
		return nil
	}
	return expand(fc)
}

// explain adds what only the function's caller can know to findings about
// an ImagePrefetcher: how it was invoked, and what else is in the input.
func explain(rs framework.Results, src *yaml.RNode, items []*yaml.RNode, generator bool) {
	for _, r := range rs {
		if r.Severity != framework.Error || r.Field == nil {
			continue
		}
		switch r.Field.Path {
		case "metadata.name":
			// A name kustomize lengthened before the function ran
			// (namePrefix or nameSuffix of the kustomization that lists
			// it): say where the extra characters came from.
			orig := kustomizeid.Original(src).Name
			if len(src.GetName()) > validation.DNS1123LabelMaxLength && orig != src.GetName() {
				r.Message += fmt.Sprintf("; kustomize's namePrefix/nameSuffix made it from %q, "+
					"so shorten the name or the prefix/suffix", orig)
			}
		case "metadata.namespace":
			if generator && src.GetNamespace() == "" {
				r.Message += "; in generator mode, a kustomization's namespace: never reaches the generator's config (kustomize applies it to the output afterwards), so set metadata.namespace in the ImagePrefetcher itself"
			}
		case "spec.imageListFrom.configMapRef.name":
			name, _ := src.Pipe(yaml.Lookup("spec", "imageListFrom", "configMapRef", "name"))
			if name == nil {
				continue
			}
			var elsewhere []string
			for _, it := range items {
				if it.GetKind() == "ConfigMap" && it.GetName() == yaml.GetValue(name) && it.GetNamespace() != src.GetNamespace() {
					elsewhere = append(elsewhere, cmp.Or(it.GetNamespace(), "(none)"))
				}
			}
			if len(elsewhere) > 0 {
				r.Message += fmt.Sprintf("; a ConfigMap of that name is in namespace %s, but the reference is looked up in the ImagePrefetcher's own namespace %q: move one of them", strings.Join(elsewhere, ", "), src.GetNamespace())
			}
		}
	}
}

// kptSelection is kpt's mark on every item it passes to a pipeline step
// that has selectors: or exclude: (kpt fn eval: --match-*, --exclude-*), by
// which it merges the step's output back into the package. kpt 1.0 sets it
// only then.
const kptSelection = "internal.config.k8s.io/kpt-resource-id"

// selectionRefused is the error for a kpt step that was given a selection
// of the package, or nil. The function must see the whole package: to
// replace what it rendered before (a selection leaves the earlier output
// out, and every render would add another copy of it), to find the
// ConfigMaps and workloads an ImagePrefetcher reads, and to see every
// instance it must check names against. It refuses rather than render a
// part.
func selectionRefused(items []*yaml.RNode, fc *yaml.RNode) *framework.Result {
	var ip *yaml.RNode
	selected := false
	for _, it := range items {
		if _, ok := it.GetAnnotations()[kptSelection]; ok {
			selected = true
		}
		if ip == nil && isPrefetcher(it) {
			ip = it
		}
	}
	if !selected {
		return nil
	}
	r := &framework.Result{Severity: framework.Error, Message: "kpt gave image-prefetcher-fn only the resources its step's selectors: or exclude: chose (kpt fn eval: --match-*, --exclude-*), " +
		"but the function needs the whole package, to replace what it rendered before and to read the ConfigMaps and workloads an ImagePrefetcher names: " +
		"remove selectors: and exclude: from the image-prefetcher-fn step; to render some instances only, give each its own step with configPath: (docs/integrations/kpt.md)"}
	if ip == nil && fc != nil && isPrefetcher(fc) {
		ip = fc
	}
	if ip != nil {
		r.ResourceRef, r.File = refOf(ip), fileOf(ip)
	}
	return r
}
