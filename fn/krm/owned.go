package krm

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
)

// RenderedForAnnotation marks every object the function renders with the
// ImagePrefetcher it rendered it for, as "<namespace>/<name>". It is how a
// later run knows what it owns: what it rendered earlier and no longer
// renders is removed, and an object without the mark is never touched.
const RenderedForAnnotation = v1alpha1.LabelDomain + "/rendered-for"

// localConfig marks an object that tools keep in the package but never
// apply: kpt live apply and kustomize build leave it out.
const localConfig = "config.kubernetes.io/local-config"

// instance names an ImagePrefetcher: everything it renders derives from it.
type instance struct{ namespace, name string }

func instanceOf(ip *yaml.RNode) instance { return instance{ip.GetNamespace(), ip.GetName()} }

func (i instance) String() string { return i.namespace + "/" + i.name }

// markRendered puts the owner mark on each object rendered for src.
// Rendered objects are mappings with metadata: setting cannot fail.
func markRendered(objs []*yaml.RNode, src *yaml.RNode) {
	for _, o := range objs {
		_ = o.PipeE(yaml.SetAnnotation(RenderedForAnnotation, instanceOf(src).String()))
	}
}

// ownerOf is the instance the function rendered n for, if it rendered n.
// Output of releases before the mark is recognized by the function's labels
// together with the file the function wrote it to, which names the
// instance: image-prefetcher.<namespace>.<name>.yaml.
func ownerOf(n *yaml.RNode) (instance, bool) {
	a := n.GetAnnotations()
	if v, ok := a[RenderedForAnnotation]; ok {
		ns, name, ok := strings.Cut(v, "/")
		return instance{ns, name}, ok && ns != "" && name != ""
	}
	l := n.GetLabels()
	if l[render.LabelManagedBy] != render.ManagedBy || l[render.LabelInstance] == "" {
		return instance{}, false
	}
	rest, ok := strings.CutPrefix(path.Base(pathOf(n)), "image-prefetcher.")
	if !ok {
		return instance{}, false
	}
	rest, ok = strings.CutSuffix(rest, ".yaml")
	if !ok {
		return instance{}, false
	}
	ns, name, ok := strings.Cut(rest, ".")
	if !ok || name != l[render.LabelInstance] {
		return instance{}, false
	}
	return instance{ns, name}, true
}

// pathOf is the package file kpt read n from, or "".
func pathOf(n *yaml.RNode) string {
	p := n.GetAnnotations()[pathAnnotation]
	if p == "" {
		return ""
	}
	return path.Clean(p)
}

// keepIntent is the ImagePrefetcher item a kpt run keeps in the package:
// the intent the package renders from. It must never reach the cluster
// (there is no such API there), so it carries the local-config mark that
// kpt live apply and kustomize honour; the function adds the mark when it
// is missing and says so.
func keepIntent(ip *yaml.RNode) (*yaml.RNode, *framework.Result) {
	if v, set := ip.GetAnnotations()[localConfig]; set {
		if v == "true" {
			return ip, nil
		}
		return ip, &framework.Result{Severity: framework.Warning,
			Message:     fmt.Sprintf(`is %q: the ImagePrefetcher stays in the package as its intent, and kpt live apply would send it to a cluster that has no such API; set it to "true"`, v),
			ResourceRef: refOf(ip), File: fileOf(ip), Field: &framework.Field{Path: "metadata.annotations." + localConfig}}
	}
	// A copy: the pass-through copies an unchanged item's input bytes, and
	// this one changes.
	marked := ip.Copy()
	if err := marked.PipeE(yaml.SetAnnotation(localConfig, "true")); err != nil {
		return ip, &framework.Result{Severity: framework.Error, Message: fmt.Sprintf("cannot mark the ImagePrefetcher as local-config: %v", err),
			ResourceRef: refOf(ip), File: fileOf(ip), Field: &framework.Field{Path: "metadata.annotations"}}
	}
	return marked, &framework.Result{Severity: framework.Info,
		Message:     `added config.kubernetes.io/local-config: "true": the ImagePrefetcher is the intent this package renders from; it stays in the package and kpt live apply skips it`,
		ResourceRef: refOf(ip), File: fileOf(ip), Field: &framework.Field{Path: "metadata.annotations"}}
}

// removedResults tells, per instance, which objects of an earlier render
// a run removed because the current intent no longer renders them. An
// instance this run rendered is named as the result's resource; one that
// is gone from the package only in the message.
func removedResults(removed map[instance][]string, rendered map[instance]*yaml.RNode) framework.Results {
	owners := make([]instance, 0, len(removed))
	for o := range removed {
		owners = append(owners, o)
	}
	slices.SortFunc(owners, func(a, b instance) int { return strings.Compare(a.String(), b.String()) })
	var results framework.Results
	for _, o := range owners {
		objs := removed[o]
		slices.Sort(objs)
		r := &framework.Result{Severity: framework.Info}
		if src, ok := rendered[o]; ok {
			r.Message = "removed what image-prefetcher-fn rendered earlier for this instance and no longer renders: " + strings.Join(objs, ", ")
			r.ResourceRef, r.File = refOf(src), fileOf(src)
		} else {
			r.Message = fmt.Sprintf("removed what image-prefetcher-fn rendered earlier for ImagePrefetcher %s, which is no longer in the package: %s", o, strings.Join(objs, ", "))
		}
		results = append(results, r)
	}
	return results
}
