// Package krm runs the ImagePrefetcher expansion over a KRM ResourceList:
// it decides the mode (kustomize generator, or transformer / kpt mutator),
// passes unrelated items through untouched and reports findings as results.
package krm

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/kio/kioutil"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/kustomizeid"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
	"github.com/image-prefetcher/image-prefetcher/fn/workloads"
)

// Annotations the function reads or writes.
const (
	// NeedsHashAnnotation asks kustomize to add a content-hash suffix to a
	// generated ConfigMap and to rewrite the references to it.
	NeedsHashAnnotation = "kustomize.config.k8s.io/needs-hash"
	pathAnnotation      = string(kioutil.PathAnnotation)
	indexAnnotation     = string(kioutil.IndexAnnotation)
)

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

type expansion struct {
	source *yaml.RNode
	objs   []*yaml.RNode
	// file is where kpt writes objs, "" for kustomize's generator mode.
	file string
}

// expandAll expands the ImagePrefetchers among items.
//
// Generator mode: the functionConfig is an ImagePrefetcher and kustomize
// invoked the function as a generator (see invokedAsGenerator). Its
// expansion is appended, the ConfigMap marked for kustomize's hash suffix.
// kustomize echoes a generator's config as an item; that copy is dropped
// so that nothing is expanded twice.
//
// Transformer mode, kustomize: every ImagePrefetcher item is replaced by
// its expansion, in place. An upper kustomization running the function
// again therefore never sees it, and never expands it twice. An
// ImagePrefetcher functionConfig that is not among the items (an
// annotated ImagePrefetcher under transformers:) is expanded after them.
//
// kpt: the package is the source of truth and is rendered in place, again
// and again. Every ImagePrefetcher stays (it is the intent), marked
// local-config; its expansion goes to a file of its own next to it. With
// an ImagePrefetcher as functionConfig (configPath, kpt fn eval
// --fn-config), that one instance is expanded and no other.
//
// Every rendered object carries RenderedForAnnotation. An object marked
// for an instance this run renders is replaced: what it no longer renders
// is gone. Under kpt, an object marked for an instance that is no longer in
// the package is removed too. Objects without the mark are never touched.
//
// When a result is an error, the items are returned as they came.
func expandAll(items []*yaml.RNode, fc *yaml.RNode, by Invoker) ([]*yaml.RNode, framework.Results) {
	var results framework.Results
	kpt := by == Kpt
	if r := selectionRefused(items, fc); kpt && r != nil {
		return items, framework.Results{r}
	}
	fcIsIP := fc != nil && isPrefetcher(fc)
	generator := fcIsIP && !kpt && invokedAsGenerator(items, fc)
	// Under kpt every intent stays in the package: an instance none of
	// them names any more was renamed or removed.
	present := map[instance]bool{}
	if fcIsIP {
		present[instanceOf(fc)] = true
	}
	for _, it := range items {
		if isPrefetcher(it) {
			present[instanceOf(it)] = true
		}
	}
	sources := render.Sources{ConfigMaps: configMapLookup(items), StartupTaintKeys: render.StartupTaintKeys(taintSources(items, fc, present, kpt))}
	results = append(results, typoErrors(items, fc, generator)...)
	if r := misplaced(items, fc, kpt); r != nil {
		results = append(results, r)
	}
	// A kustomize generator is given its own configuration and nothing
	// else: no workload to select.
	workloadItems := items
	if generator {
		workloadItems = nil
	}

	expand := func(src *yaml.RNode) *expansion {
		objs, rs := expandOne(src, sources, workloadItems)
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
	switch {
	case generator:
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
						results = append(results, &framework.Result{Severity: framework.Error, Message: fmt.Sprintf("cannot mark the rendered ConfigMap for kustomize's hash suffix: %v", err),
							ResourceRef: refOf(o), Field: &framework.Field{Path: "metadata.annotations"}})
					}
				}
			}
			exps = append(exps, e)
			slots = append(slots, slot{at: -1, exp: e})
		}
	case kpt && fcIsIP:
		// The functionConfig is this step's one instance. Its item (the
		// configPath file) stays and places the expansion; the content
		// expanded is the functionConfig's, which differs from the item's
		// only under kpt fn eval --fn-config.
		at, place := -1, fc
		for _, it := range items {
			if isPrefetcher(it) && idOf(it) == idOf(fc) {
				if at >= 0 {
					continue
				}
				kept, r := keepIntent(it)
				results = appendResult(results, r)
				out = append(out, kept)
				at, place = len(out), it
				continue
			}
			out = append(out, it)
		}
		if e := expand(fc); e != nil {
			setPaths(e, place)
			exps = append(exps, e)
			slots = append(slots, slot{at: at, exp: e})
		}
	case kpt:
		for _, it := range items {
			if !isPrefetcher(it) {
				out = append(out, it)
				continue
			}
			kept, r := keepIntent(it)
			results = appendResult(results, r)
			out = append(out, kept)
			if e := expand(it); e != nil {
				setPaths(e, it)
				exps = append(exps, e)
				slots = append(slots, slot{at: len(out), exp: e})
			}
		}
	default:
		for _, it := range items {
			if !isPrefetcher(it) {
				out = append(out, it)
				continue
			}
			if e := expand(it); e != nil {
				setPaths(e, it)
				exps = append(exps, e)
				slots = append(slots, slot{at: len(out), exp: e})
			} else {
				out = append(out, it)
			}
		}
		if e := expandConfig(fc, items, expand); e != nil {
			setPaths(e, fc)
			exps = append(exps, e)
			slots = append(slots, slot{at: -1, exp: e})
		}
	}
	if results.ExitCode() != 0 {
		return items, results
	}

	if rs := sameNames(exps, items, kpt); len(rs) > 0 {
		return items, append(results, rs...)
	}

	// Identities of everything rendered now: an earlier rendering of the
	// same object is dropped; any other object with that identity is a
	// conflict.
	rendered := map[id]*expansion{}
	renderedObjs := map[id]*yaml.RNode{}
	scope := map[instance]*yaml.RNode{}
	files := map[string]*expansion{}
	for _, e := range exps {
		scope[instanceOf(e.source)] = e.source
		if e.file != "" {
			files[e.file] = e
		}
		for _, o := range e.objs {
			oid := idOf(o)
			if prev, dup := rendered[oid]; dup {
				results = append(results, conflict(e.source, fmt.Sprintf("renders %s, which %s also renders: each instance needs its own name or namespace", oid, idOf(prev.source))))
				break // one finding per pair of instances is enough
			}
			rendered[oid] = e
			renderedObjs[oid] = o
		}
	}
	removed := map[instance][]string{}
	redeclared := map[instance]bool{}
	dropped := make([]bool, len(out))
	for i, it := range out {
		owner, owned := ownerOf(it)
		e, clash := rendered[idOf(it)]
		switch {
		case isPrefetcher(it):
		case owned && scope[owner] != nil && !kpt && !generator && !sameRendering(it, renderedObjs[idOf(it)]):
			// kustomize: a lower layer rendered this instance, and this
			// layer declares it again, differently (or a layer between
			// patched the rendering). Replacing the lower rendering would
			// silently drop what that layer declared or patched. The same
			// declaration again renders the same objects, and is replaced.
			if !redeclared[owner] {
				redeclared[owner] = true
				results = append(results, conflict(scope[owner], fmt.Sprintf(
					"%s is declared again: a lower layer rendered ImagePrefetcher %s already (%s carries %s: %s), and rendering it here would replace "+
						"what that layer declared; declare each instance in one layer only (patch the lower declaration instead), or give this one a name of its own",
					idOf(scope[owner]), owner, idOf(it), RenderedForAnnotation, owner)))
			}
			continue
		case owned && (scope[owner] != nil || kpt && !present[owner]):
			dropped[i] = true
			if !clash {
				removed[owner] = append(removed[owner], idOf(it).String())
			}
			continue
		case owned && it.GetKind() == "DaemonSet":
			// A lower layer rendered it without knowing this run's instances.
			for _, e := range exps {
				for _, key := range render.Untolerated(it, render.StartupTaintKeys([]*yaml.RNode{e.source})) {
					results = append(results, &framework.Result{Severity: framework.Error, ResourceRef: refOf(it), File: fileOf(it), Field: &framework.Field{Path: "spec.template.spec.tolerations"},
						Message: fmt.Sprintf("rendered by a lower layer for ImagePrefetcher %s, which has a startup taint, does not tolerate %s, the startup taint of ImagePrefetcher %s: on a node that registers with both, neither agent starts and neither taint goes; add {key: %s, operator: Exists} to the spec.tolerations of %s", owner, key, instanceOf(e.source), key, owner)})
				}
			}
		case clash && !owned && isLegacyRendering(it, e.source):
			dropped[i] = true
			continue
		case clash:
			results = append(results, conflict(e.source, fmt.Sprintf("renders %s, which already exists in the input and was not rendered by this function: rename the instance, or remove or rename that object", idOf(it))))
			continue
		}
		if e, taken := files[pathOf(it)]; taken {
			results = append(results, conflict(e.source, fmt.Sprintf("image-prefetcher-fn writes what this instance renders to %q, but that file holds %s, which the function did not render: move that object to another file, or rename the file", e.file, idOf(it))))
		}
	}
	if !kpt {
		results = append(results, siblingDeadlocks(out, dropped)...)
	}
	if results.ExitCode() != 0 {
		return items, results
	}
	results = append(results, removedResults(removed, scope)...)

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

func appendResult(rs framework.Results, r *framework.Result) framework.Results {
	if r == nil {
		return rs
	}
	return append(rs, r)
}

// isLegacyRendering recognizes an object rendered for src before the
// function marked its output: same identity and the function's labels.
func isLegacyRendering(it, src *yaml.RNode) bool {
	l := it.GetLabels()
	return l[render.LabelManagedBy] == render.ManagedBy && l[render.LabelInstance] == src.GetName()
}

// setPaths tells kpt where to write new objects: one file per instance,
// next to the file the ImagePrefetcher (place) came from. kpt rejects two
// objects with the same path and index, and one directory may hold
// instances of the same name in different namespaces, so the file is named
// like the cluster-scoped objects: image-prefetcher.<namespace>.<name>.yaml,
// unique per instance because neither part can hold a '.'. kustomize
// strips these annotations.
//
// Not kyaml's filters.FileSetter: its FilenamePattern takes %k, %n and %s
// from each object's own kind, name and namespace, and it substitutes them
// in the whole path. With the instance's file as the pattern, a package
// directory named team%site put the 9 objects of one instance into
// teamite/ and teamprefetchite/ (measured); it would save two lines.
func setPaths(e *expansion, place *yaml.RNode) {
	dir := path.Dir(pathOf(place))
	e.file = path.Join(dir, render.NamesFor(e.source.GetNamespace(), e.source.GetName()).Cluster+".yaml")
	for i, o := range e.objs {
		_ = o.PipeE(yaml.SetAnnotation(pathAnnotation, e.file))
		_ = o.PipeE(yaml.SetAnnotation(indexAnnotation, strconv.Itoa(i)))
	}
}

// conflict is an error about the names an ImagePrefetcher renders. Those
// names derive from its metadata.name (and namespace), so that is the field
// to change; the message names the other object.
func conflict(src *yaml.RNode, msg string) *framework.Result {
	return &framework.Result{Severity: framework.Error, Message: msg, ResourceRef: refOf(src), File: fileOf(src), Field: &framework.Field{Path: "metadata.name"}}
}

func refOf(n *yaml.RNode) *yaml.ResourceIdentifier {
	return &yaml.ResourceIdentifier{
		TypeMeta: yaml.TypeMeta{APIVersion: n.GetApiVersion(), Kind: n.GetKind()},
		NameMeta: yaml.NameMeta{Name: n.GetName(), Namespace: n.GetNamespace()},
	}
}

// fileOf is where kpt read n from, or nil. (framework.Execute copies the
// config.kubernetes.io/ form of the path and index to the internal one.)
func fileOf(n *yaml.RNode) *framework.File {
	a := n.GetAnnotations()
	p := a[pathAnnotation]
	if p == "" {
		return nil
	}
	idx, _ := strconv.Atoi(a[indexAnnotation])
	return &framework.File{Path: p, Index: idx}
}

// expandOne decodes, validates and renders one ImagePrefetcher. items are
// the objects its spec.imageListFrom.workloads selects from; nil when the
// function cannot see them.
func expandOne(src *yaml.RNode, sources render.Sources, items []*yaml.RNode) ([]*yaml.RNode, framework.Results) {
	var results framework.Results
	var col *workloads.Collection
	// render's findings name a field of src, or of a workload it selected
	// (ResourceRef set); they are told where the object is.
	add := func(rs framework.Results) {
		for _, r := range rs {
			if r.ResourceRef == nil {
				r.ResourceRef, r.File = refOf(src), fileOf(src)
			} else if col != nil {
				ref := r.ResourceRef
				w := workloads.Ref{APIVersion: ref.APIVersion, Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}
				if n := col.Node(w); n != nil {
					r.File = fileOf(n)
				}
			}
			results = append(results, r)
		}
	}
	if v := src.GetApiVersion(); v != v1alpha1.APIVersion {
		add(framework.Results{fieldError("apiVersion", fmt.Sprintf("%q is not supported: use %s", v, v1alpha1.APIVersion))})
		return nil, results
	}
	// Without metadata there is no instance to name; the findings about
	// its name and namespace would name an empty reference. (Only a
	// functionConfig gets here: framework.Execute gives every item
	// metadata.)
	if md, _ := src.Pipe(yaml.Lookup("metadata")); md.IsNilOrEmpty() {
		add(framework.Results{fieldError("metadata", "is required: it holds the instance's name and namespace, "+
			"metadata: {name: <instance>, namespace: <namespace of its agents>}")})
		return nil, results
	}
	ip, probs := render.Decode(src)
	add(probs)
	if probs.ExitCode() != 0 {
		return nil, results
	}
	if lf := ip.Spec.ImageListFrom; lf != nil && lf.Workloads != nil && items != nil {
		c := workloads.Collect(items, lf.Workloads)
		col, sources.Workloads = &c, &c
	}
	cfg, probs := render.ValidateSources(ip, sources)
	add(probs)
	if probs.ExitCode() != 0 {
		return nil, results
	}
	objs, err := render.Render(cfg)
	if err != nil {
		// A bug, not bad input: Validate accepted the spec.
		add(framework.Results{fieldError("spec", "internal error, please report it: "+err.Error())})
		return nil, results
	}
	markRendered(objs, src)
	if probs := render.CheckRenderedAnnotations(objs); probs.ExitCode() != 0 {
		add(probs)
		return nil, results
	}
	add(suffixWarnings(objs))
	return objs, results
}

// fieldError is an error at the field path of the object it is added to.
func fieldError(path, msg string) *framework.Result {
	return &framework.Result{Severity: framework.Error, Message: msg, Field: &framework.Field{Path: path}}
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
			// kustomize keeps every earlier name, one per layer that renamed
			// it: a reference may use any of them.
			match := it.GetName() == name
			for _, id := range kustomizeid.Previous(it) {
				match = match || id.Name == name
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
