package krm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
)

// The composition rules: where the function cannot tell what the user
// meant, it fails and says what to change, never exits 0 with a result the
// user did not ask for.

// taintSources are the objects whose startup taints this run's instances
// must tolerate: every ImagePrefetcher, and the DaemonSets of instances
// this run does not render. A DaemonSet rendered earlier for an instance
// declared now is replaced, and under kpt one whose instance is gone is
// removed: reading their taints would tolerate a key that no longer
// exists, and the next render would drop it again.
func taintSources(items []*yaml.RNode, fc *yaml.RNode, declared map[instance]bool, kpt bool) []*yaml.RNode {
	srcs := []*yaml.RNode{fc}
	for _, it := range items {
		if owner, owned := ownerOf(it); owned && it.GetKind() == "DaemonSet" && (kpt || declared[owner]) {
			continue
		}
		srcs = append(srcs, it)
	}
	return srcs
}

// siblingDeadlocks checks the DaemonSets lower kustomize layers rendered
// against each other: layers rendered apart never saw each other's
// startup taint, and a node that registers with both taints starts
// neither agent when neither tolerates the other's taint.
func siblingDeadlocks(out []*yaml.RNode, dropped []bool) framework.Results {
	var lower []*yaml.RNode
	for i, it := range out {
		if _, owned := ownerOf(it); owned && !dropped[i] && it.GetKind() == "DaemonSet" {
			lower = append(lower, it)
		}
	}
	var results framework.Results
	for _, a := range lower {
		ownerA, _ := ownerOf(a)
		for _, b := range lower {
			ownerB, _ := ownerOf(b)
			if ownerA == ownerB {
				continue
			}
			for _, key := range render.Untolerated(a, render.StartupTaintKeys([]*yaml.RNode{b})) {
				results = append(results, &framework.Result{Severity: framework.Error, ResourceRef: refOf(a), File: fileOf(a),
					Field: &framework.Field{Path: "spec.template.spec.tolerations"},
					Message: fmt.Sprintf("rendered by a lower layer for ImagePrefetcher %s, which has a startup taint, does not tolerate %s, the startup taint "+
						"of ImagePrefetcher %s (%s, rendered by another lower layer): on a node that registers with both taints this agent never starts "+
						"before the other's taint goes, and if neither tolerates the other's, neither taint ever goes; "+
						"add {key: %s, operator: Exists} to the spec.tolerations of ImagePrefetcher %s", ownerA, key, ownerB, idOf(b), key, ownerA)})
			}
		}
	}
	return results
}

// typoErrors: an object of the function's API group whose kind the
// function does not know, or an ImagePrefetcher under a misspelled group,
// is refused. Passed through it would fail at apply time ("no matches for
// kind"); as a kustomize generator's configuration kustomize drops it, and
// nothing would be deployed at all. (An ImagePrefetcher of an unknown
// version is an error of its own, see expandOne.)
func typoErrors(items []*yaml.RNode, fc *yaml.RNode, generator bool) framework.Results {
	var rs framework.Results
	check := func(n *yaml.RNode, config bool) {
		group, _, grouped := strings.Cut(n.GetApiVersion(), "/")
		if !grouped {
			group = "" // the core group: "v1"
		}
		kind := n.GetKind()
		what := "this object is not expanded, and applying it fails (no such kind)"
		if config {
			what = "the function's configuration is not an ImagePrefetcher, so nothing is rendered, and kustomize drops a generator's configuration from its output"
		}
		var msg, field string
		switch {
		case group == v1alpha1.Group && kind != v1alpha1.Kind:
			msg, field = fmt.Sprintf("%q is not a kind of %s: %s; write kind: %s", kind, v1alpha1.Group, what, v1alpha1.Kind), "kind"
		case group != v1alpha1.Group && strings.EqualFold(kind, v1alpha1.Kind) && (strings.Contains(group, "prefetch") || group == ""):
			msg, field = fmt.Sprintf("%q is not %s: %s; write apiVersion: %s", n.GetApiVersion(), v1alpha1.APIVersion, what, v1alpha1.APIVersion), "apiVersion"
		default:
			return
		}
		rs = append(rs, &framework.Result{Severity: framework.Error, Message: msg, ResourceRef: refOf(n), File: fileOf(n), Field: &framework.Field{Path: field}})
	}
	for _, it := range items {
		check(it, fc != nil && isEcho(it, fc))
	}
	if fc != nil && !slices.ContainsFunc(items, func(it *yaml.RNode) bool { return idOf(it) == idOf(fc) }) {
		check(fc, true)
	}
	return rs
}

// isEcho tells kustomize's copy of a generator's configuration among the
// items: the same object, marked local-config.
func isEcho(it, fc *yaml.RNode) bool {
	return idOf(it) == idOf(fc) && it.GetAnnotations()[localConfig] == "true"
}

// misplaced is the error for a kustomize declaration in which the
// function can see nothing to do, or nil. kustomize calls a function
// listed under generators:, and one under transformers: of a
// kustomization without resources:, with its own configuration as the
// only item. With a configuration that is not an ImagePrefetcher (the
// function's exec ConfigMap under generators:), the ImagePrefetchers of
// resources: pass by unexpanded. With an annotated ImagePrefetcher, the
// two calls are alike; kustomize runs an exec function in the directory
// of its kustomization, and that file tells them apart: under
// transformers:, kustomize would not add the ConfigMap's hash suffix and
// would leave its needs-hash annotation for the cluster.
func misplaced(items []*yaml.RNode, fc *yaml.RNode, kpt bool) *framework.Result {
	if kpt || fc == nil || len(items) == 0 || slices.ContainsFunc(items, func(it *yaml.RNode) bool { return !isEcho(it, fc) }) {
		return nil
	}
	group, _, _ := strings.Cut(fc.GetApiVersion(), "/")
	if !isPrefetcher(fc) {
		if group == v1alpha1.Group || strings.EqualFold(fc.GetKind(), v1alpha1.Kind) {
			return nil // typoErrors says what is wrong
		}
		return &framework.Result{Severity: framework.Error, ResourceRef: refOf(fc), Field: &framework.Field{Path: "metadata.annotations.config.kubernetes.io/function"},
			Message: "is image-prefetcher-fn's configuration, and kustomize gave the function nothing else, as it does to a function listed under " +
				"generators: (or under transformers: of a kustomization without resources:): the function sees no ImagePrefetcher and would render nothing; " +
				"list this file under transformers: of the kustomization whose resources: hold the ImagePrefetchers, " +
				"or put the config.kubernetes.io/function annotation on the ImagePrefetcher itself and list it under generators:"}
	}
	file, ok := listedUnderTransformers(".", fc)
	if !ok {
		return nil
	}
	return &framework.Result{Severity: framework.Error, ResourceRef: refOf(fc), File: &framework.File{Path: file}, Field: &framework.Field{Path: "metadata.annotations.config.kubernetes.io/function"},
		Message: "is listed under transformers: of a kustomization without resources:, so there is nothing to transform, and kustomize treats " +
			"what it renders as transformed, not generated: the image list ConfigMap would get no hash suffix and keep kustomize.config.k8s.io/needs-hash; " +
			"list it under generators: instead, or list it under resources: and the function under transformers:"}
}

// listedUnderTransformers tells whether the kustomization in dir lists
// a file holding fc (or fc inline) under transformers:, and not under
// generators:, and names that file.
func listedUnderTransformers(dir string, fc *yaml.RNode) (string, bool) {
	for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		var k struct {
			Generators   []string `yaml:"generators"`
			Transformers []string `yaml:"transformers"`
		}
		if yaml.Unmarshal(b, &k) != nil {
			return "", false
		}
		holds := func(entry string) bool {
			text := entry
			if !strings.Contains(entry, "\n") {
				b, err := os.ReadFile(filepath.Join(dir, entry))
				if err != nil {
					return false
				}
				text = string(b)
			}
			nodes, err := kio.FromBytes([]byte(text))
			if err != nil {
				return false
			}
			return slices.ContainsFunc(nodes, func(n *yaml.RNode) bool { return idOf(n) == idOf(fc) })
		}
		if slices.ContainsFunc(k.Generators, holds) {
			return "", false
		}
		for _, entry := range k.Transformers {
			if holds(entry) {
				if strings.Contains(entry, "\n") {
					entry = name
				}
				return entry, true
			}
		}
		return "", false
	}
	return "", false
}

// sameRendering tells whether an object a lower layer rendered is, but
// for the annotations the tools add on the way, the object this run
// renders in its place.
func sameRendering(lower, now *yaml.RNode) bool {
	if now == nil {
		return false
	}
	strip := func(n *yaml.RNode) string {
		c := n.Copy()
		for k := range c.GetAnnotations() {
			if strings.HasPrefix(k, "config.kubernetes.io/") || strings.HasPrefix(k, "internal.config.kubernetes.io/") ||
				k == kustomizeID || k == "config.k8s.io/id" {
				_ = c.PipeE(yaml.ClearAnnotation(k))
			}
		}
		// An empty annotations map left behind is no difference.
		if a, _ := c.Pipe(yaml.Lookup("metadata", "annotations")); a != nil && len(a.Content()) == 0 {
			_ = c.PipeE(yaml.Lookup("metadata"), yaml.Clear("annotations"))
		}
		return c.MustString()
	}
	return strip(lower) == strip(now)
}

// suffixWarnings: the agent and the admission policy know a copy of an
// instance by its DaemonSet's name as the pod name keeps it
// (v1alpha1.DaemonSetOfPod), whole up to 57 characters. From 57 on, a
// nameSuffix added after the function never reaches the pod name: copies
// under two suffixes would share one identity and overwrite each other's
// node key. A prefix always does; so does a shorter instance name.
func suffixWarnings(objs []*yaml.RNode) framework.Results {
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" || len(o.GetName()) < maxSuffixableDaemonSet {
			continue
		}
		return framework.Results{{Severity: framework.Warning, Field: &framework.Field{Path: "metadata.name"}, Message: fmt.Sprintf(
			"the DaemonSet %s has %d characters: a nameSuffix added after the function would be cut from its pods' names, "+
				"so copies of this instance under different suffixes would share one identity; use a namePrefix for copies, "+
				"or an instance name of at most %d characters", o.GetName(), len(o.GetName()), maxSuffixableDaemonSet-len("image-prefetcher-")-1)}}
	}
	return nil
}

// maxSuffixableDaemonSet is the length of a DaemonSet name from which a
// suffix no longer reaches the pod name: the apiserver keeps 58
// characters of <daemonset>-, and DaemonSetOfPod drops a trailing '-'.
const maxSuffixableDaemonSet = 57
