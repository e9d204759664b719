// Package krm runs the ImagePrefetcher expansion over a KRM ResourceList:
// it decides the mode (kustomize generator, or transformer / kpt mutator),
// passes unrelated items through untouched and reports findings as results.
package krm

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/kio/kioutil"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
)

// Annotations the function reads or writes.
const (
	// NeedsHashAnnotation asks kustomize to add a content-hash suffix to a
	// generated ConfigMap and to rewrite the references to it.
	NeedsHashAnnotation = "kustomize.config.k8s.io/needs-hash"
	pathAnnotation      = string(kioutil.PathAnnotation)
	indexAnnotation     = string(kioutil.IndexAnnotation)
	legacyPath          = string(kioutil.LegacyPathAnnotation)
	// previousNames is how kustomize tells a function what an object was
	// called before namePrefix/nameSuffix renamed it.
	previousNames = "internal.config.kubernetes.io/previousNames"
)

// Processor is the function. It never returns an error for bad input:
// findings become results, and the boolean is false when one is an error.
var Processor = fn.ResourceListProcessorFunc(Process)

type id struct{ apiVersion, kind, namespace, name string }

func idOf(n *yaml.RNode) id {
	return id{n.GetApiVersion(), n.GetKind(), n.GetNamespace(), n.GetName()}
}

func (i id) String() string {
	if i.namespace == "" {
		return fmt.Sprintf("%s %s", i.kind, i.name)
	}
	return fmt.Sprintf("%s %s/%s", i.kind, i.namespace, i.name)
}

func isPrefetcher(n *yaml.RNode) bool {
	return n.GetKind() == v1alpha1.Kind && strings.HasPrefix(n.GetApiVersion(), v1alpha1.Group+"/")
}

// Process expands ImagePrefetchers in rl.
//
// Generator mode: the functionConfig is an ImagePrefetcher and kustomize
// invoked the function as a generator (see invokedAsGenerator). Its
// expansion is appended, the ConfigMap marked for kustomize's hash suffix.
// kustomize echoes a generator's config as an item; that copy is dropped
// so that nothing is expanded twice.
//
// Transformer mode: otherwise. Every ImagePrefetcher item is replaced by its
// expansion, in place; an ImagePrefetcher functionConfig that is not among
// the items (kustomize's transformers:) is expanded at the end. Under kpt, an ImagePrefetcher that is also the
// functionConfig (configPath) is the pipeline's config file and stays; its
// expansion follows it.
//
// In both modes, objects this instance rendered earlier (same identity,
// carrying our labels) are replaced, never duplicated, so the function is
// idempotent on its own output.
func Process(rl *fn.ResourceList) (bool, error) {
	items := make([]*yaml.RNode, len(rl.Items))
	for i, ko := range rl.Items {
		items[i] = ko.MoveToResourceNode()
	}
	var fc *yaml.RNode
	if rl.FunctionConfig != nil && !rl.FunctionConfig.IsEmpty() {
		fc = rl.FunctionConfig.CopyToResourceNode()
	}
	out, results := expandAll(items, fc)
	if results.ExitCode() != 0 {
		out = items // leave the input as it was
	}
	rl.Items = fn.MoveToKubeObjects(out)
	// Results describe one invocation. Results already in the input come
	// from an earlier run (or another function): keeping them would repeat
	// each warning every time the function runs on its own output, and an
	// old error would fail a run that found nothing wrong.
	rl.Results = results
	return results.ExitCode() == 0, nil
}

type expansion struct {
	source *yaml.RNode
	objs   []*yaml.RNode
}

func expandAll(items []*yaml.RNode, fc *yaml.RNode) ([]*yaml.RNode, fn.Results) {
	var results fn.Results
	kpt := false
	for _, it := range items {
		a := it.GetAnnotations()
		if a[pathAnnotation] != "" || a[legacyPath] != "" {
			kpt = true
			break
		}
	}
	fcIsIP := fc != nil && isPrefetcher(fc)
	generator := fcIsIP && !kpt && invokedAsGenerator(items, fc)
	lookup := configMapLookup(items)
	results = append(results, typoWarnings(items, fc)...)

	expand := func(src *yaml.RNode) *expansion {
		objs, rs := expandOne(src, lookup)
		explain(rs, src, items, generator)
		results = append(results, rs...)
		if objs == nil {
			return nil
		}
		return &expansion{source: src, objs: objs}
	}

	var out []*yaml.RNode
	var exps []*expansion
	// A slot puts an expansion before out[at]; at == -1 means the end.
	type slot struct {
		at  int
		exp *expansion
	}
	var slots []slot
	if generator {
		fcID := idOf(fc)
		for _, it := range items {
			if isPrefetcher(it) && idOf(it) == fcID {
				continue // kustomize's echo of the generator config
			}
			out = append(out, it)
		}
		if e := expand(fc); e != nil {
			for _, o := range e.objs {
				if o.GetKind() == "ConfigMap" {
					if err := o.PipeE(yaml.SetAnnotation(NeedsHashAnnotation, "true")); err != nil {
						results = append(results, &fn.Result{Severity: fn.Error, Message: fmt.Sprintf("cannot mark the rendered ConfigMap for kustomize's hash suffix: %v", err),
							ResourceRef: refOf(o), Field: &fn.Field{Path: "metadata.annotations"}})
					}
				}
			}
			exps = append(exps, e)
			slots = append(slots, slot{at: -1, exp: e})
		}
	} else {
		fcSeen := false
		for _, it := range items {
			if !isPrefetcher(it) {
				out = append(out, it)
				continue
			}
			keep := fcIsIP && idOf(it) == idOf(fc)
			if keep {
				if fcSeen {
					continue
				}
				fcSeen = true
				out = append(out, it)
			}
			if e := expand(it); e != nil {
				setPaths(e)
				exps = append(exps, e)
				slots = append(slots, slot{at: len(out), exp: e})
			} else if !keep {
				out = append(out, it)
			}
		}
		if fcIsIP && !fcSeen {
			if e := expand(fc); e != nil {
				setPaths(e)
				exps = append(exps, e)
				slots = append(slots, slot{at: -1, exp: e})
			}
		}
	}
	if results.ExitCode() != 0 {
		return items, results
	}

	// Identities of everything rendered now: an earlier rendering of the
	// same object is dropped; any other object with that identity is a
	// conflict.
	rendered := map[id]*expansion{}
	for _, e := range exps {
		for _, o := range e.objs {
			oid := idOf(o)
			if prev, dup := rendered[oid]; dup {
				results = append(results, conflict(e.source, fmt.Sprintf("renders %s, which %s also renders: each instance needs its own name or namespace", oid, idOf(prev.source))))
				break // one finding per pair of instances is enough
			}
			rendered[oid] = e
		}
	}
	dropped := make([]bool, len(out))
	for i, it := range out {
		e, clash := rendered[idOf(it)]
		if !clash {
			continue
		}
		l := it.GetLabels()
		if l[render.LabelManagedBy] == render.ManagedBy && l[render.LabelInstance] == e.source.GetName() {
			dropped[i] = true
			continue
		}
		results = append(results, conflict(e.source, fmt.Sprintf("renders %s, which already exists in the input and was not rendered by this function: rename the instance, or remove or rename that object", idOf(it))))
	}
	if results.ExitCode() != 0 {
		return items, results
	}

	final := make([]*yaml.RNode, 0, len(out)+len(rendered))
	emit := func(at int) {
		for _, s := range slots {
			if s.at == at {
				final = append(final, s.exp.objs...)
			}
		}
	}
	for i, it := range out {
		emit(i)
		if !dropped[i] {
			final = append(final, it)
		}
	}
	emit(len(out))
	emit(-1)
	return final, results
}

// setPaths tells kpt where to write new objects: one file per instance,
// next to the file the ImagePrefetcher came from. kpt rejects two objects
// with the same path and index, and one directory may hold instances of
// the same name in different namespaces, so the file is named like the
// cluster-scoped objects: image-prefetcher.<namespace>.<name>.yaml, unique
// per instance because neither part can hold a '.'.
func setPaths(e *expansion) {
	a := e.source.GetAnnotations()
	src := a[pathAnnotation]
	if src == "" {
		src = a[legacyPath]
	}
	file := path.Join(path.Dir(src), render.NamesFor(e.source.GetNamespace(), e.source.GetName()).Cluster+".yaml")
	for i, o := range e.objs {
		_ = o.PipeE(yaml.SetAnnotation(pathAnnotation, file))
		_ = o.PipeE(yaml.SetAnnotation(indexAnnotation, strconv.Itoa(i)))
	}
}

// conflict is an error about the names an ImagePrefetcher renders. Those
// names derive from its metadata.name (and namespace), so that is the field
// to change; the message names the other object.
func conflict(src *yaml.RNode, msg string) *fn.Result {
	return &fn.Result{Severity: fn.Error, Message: msg, ResourceRef: refOf(src), File: fileOf(src), Field: &fn.Field{Path: "metadata.name"}}
}

func refOf(n *yaml.RNode) *fn.ResourceRef {
	return &fn.ResourceRef{APIVersion: n.GetApiVersion(), Kind: n.GetKind(), Name: n.GetName(), Namespace: n.GetNamespace()}
}

func fileOf(n *yaml.RNode) *fn.File {
	a := n.GetAnnotations()
	p := a[pathAnnotation]
	if p == "" {
		p = a[legacyPath]
	}
	if p == "" {
		return nil
	}
	idx, _ := strconv.Atoi(a[indexAnnotation])
	return &fn.File{Path: p, Index: idx}
}

// expandOne decodes, validates and renders one ImagePrefetcher.
func expandOne(src *yaml.RNode, lookup render.ConfigMapLookup) ([]*yaml.RNode, fn.Results) {
	var results fn.Results
	add := func(ps render.Problems) {
		for _, p := range ps {
			r := &fn.Result{Severity: fn.Severity(p.Severity), Message: p.Message, ResourceRef: refOf(src), File: fileOf(src)}
			if p.Path != "" {
				r.Field = &fn.Field{Path: p.Path}
			}
			results = append(results, r)
		}
	}
	if v := src.GetApiVersion(); v != v1alpha1.APIVersion {
		add(render.Problems{{Severity: render.Error, Path: "apiVersion", Message: fmt.Sprintf("%q is not supported: use %s", v, v1alpha1.APIVersion)}})
		return nil, results
	}
	ip, probs := render.Decode(src)
	add(probs)
	if probs.HasErrors() {
		return nil, results
	}
	cfg, probs := render.Validate(ip, lookup)
	add(probs)
	if probs.HasErrors() {
		return nil, results
	}
	objs, err := render.Render(cfg)
	if err != nil {
		// A bug, not bad input: Validate accepted the spec.
		add(render.Problems{{Severity: render.Error, Path: "spec", Message: "internal error, please report it: " + err.Error()}})
		return nil, results
	}
	return objs, results
}

// configMapLookup finds ConfigMaps among the items, by their current name
// or, after a kustomize namePrefix/nameSuffix, by their original name.
func configMapLookup(items []*yaml.RNode) render.ConfigMapLookup {
	return func(ns, name string) (map[string]string, bool) {
		var loose *yaml.RNode
		for _, it := range items {
			if it.GetKind() != "ConfigMap" || it.GetApiVersion() != "v1" {
				continue
			}
			names := []string{it.GetName()}
			if prev := it.GetAnnotations()[previousNames]; prev != "" {
				names = append(names, strings.Split(prev, ",")[0])
			}
			match := false
			for _, n := range names {
				match = match || n == name
			}
			if !match {
				continue
			}
			switch it.GetNamespace() {
			case ns:
				return it.GetDataMap(), true
			case "":
				// A namespace-less ConfigMap lands wherever it is applied;
				// accept it when no exact match exists.
				if loose == nil {
					loose = it
				}
			}
		}
		if loose != nil {
			return loose.GetDataMap(), true
		}
		return nil, false
	}
}
