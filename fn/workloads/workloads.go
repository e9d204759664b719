// Package workloads finds the images the workloads of a ResourceList run:
// the init containers, containers and image volumes of every pod template
// that an ImagePrefetcher's spec.imageListFrom.workloads selects.
//
// It reads the objects exactly as the orchestrator hands them to the
// function. In kustomize, builtin transformers (images:, namespace:,
// namePrefix:, patches:) of a kustomization run before the functions it
// lists under transformers:, so the images seen here are the ones after
// its images: override, the ones the cluster will run.
package workloads

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/resid"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/kustomizeid"
)

// Ref names a workload.
type Ref struct {
	APIVersion, Kind, Namespace, Name string
}

func (r Ref) String() string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// Image is one image reference of a workload, as written there.
type Image struct {
	Ref      string
	Workload Ref
	// Path is the field path inside the workload, such as
	// spec.template.spec.containers[0].image.
	Path string
	// NotString is set when the field holds a list or a mapping.
	NotString bool
}

// SelectorError is a selector that cannot be used: a field that is not a
// regular expression, or not a label-selector expression.
type SelectorError struct {
	Index int
	// Field is the selector's field, such as "labelSelector".
	Field string
	Err   error
}

// Skipped is a container or image volume whose image is not set, as the
// apiserver allows in a pod template, for a later mutation to fill in.
type Skipped struct {
	Workload Ref
	Path     string
}

// PullSecrets are the imagePullSecrets of a selected pod template: the
// kubelet uses them for the workload, the agent does not have them.
type PullSecrets struct {
	Workload Ref
	Path     string
	Names    []string
}

// Collection is what the selectors found.
type Collection struct {
	// Images by workload, in the order of Workloads, and within a workload
	// in the order of its pod spec: init containers, containers, image
	// volumes.
	Images []Image
	// Workloads lists every selected workload once, ordered by namespace,
	// kind, name and apiVersion, not by their place in the ResourceList:
	// kustomize and kpt order objects differently, and reordering a
	// kustomization's resources must not change the list (and roll the
	// DaemonSet).
	Workloads []Ref
	// Unmatched holds the index of every selector that matched no workload.
	Unmatched   []int
	Errors      []SelectorError
	Skipped     []Skipped
	PullSecrets []PullSecrets

	nodes map[Ref]*yaml.RNode
}

// Node returns the selected object named by ref, or nil.
func (c *Collection) Node(ref Ref) *yaml.RNode { return c.nodes[ref] }

const (
	localConfig    = "config.kubernetes.io/local-config"
	managedByLabel = "app.kubernetes.io/managed-by"
	// managedBy marks the objects the function renders. They are never
	// workloads of an ImagePrefetcher: the agent's DaemonSet runs an image
	// that is on the node before its pod starts.
	managedBy = "image-prefetcher-fn"
)

// Collect applies selectors to items. Objects that are not workloads (no
// pod template), objects the function rendered and local-config objects
// (never applied to a cluster) are not selectable.
func Collect(items []*yaml.RNode, selectors []v1alpha1.WorkloadSelector) Collection {
	c := Collection{nodes: map[Ref]*yaml.RNode{}}
	compiled := make([]*types.SelectorRegex, len(selectors))
	for i, s := range selectors {
		sr, errs := compile(s)
		for _, e := range errs {
			e.Index = i
			c.Errors = append(c.Errors, e)
		}
		if len(errs) == 0 {
			compiled[i] = sr
		}
	}
	if len(c.Errors) > 0 {
		return c
	}
	matched := make([]bool, len(selectors))
	for _, it := range items {
		if spec, _ := podSpec(it); spec == nil || it.GetLabels()[managedByLabel] == managedBy || it.GetAnnotations()[localConfig] == "true" {
			continue
		}
		selected := false
		for i, sr := range compiled {
			if matches(it, selectors[i], sr) {
				matched[i], selected = true, true
			}
		}
		if !selected {
			continue
		}
		ref := Ref{APIVersion: it.GetApiVersion(), Kind: it.GetKind(), Namespace: it.GetNamespace(), Name: it.GetName()}
		if _, dup := c.nodes[ref]; dup {
			continue // kustomize and kpt refuse duplicate identities; be safe anyway
		}
		c.nodes[ref] = it
		c.Workloads = append(c.Workloads, ref)
	}
	slices.SortFunc(c.Workloads, func(a, b Ref) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name), cmp.Compare(a.APIVersion, b.APIVersion))
	})
	for _, ref := range c.Workloads {
		spec, prefix := podSpec(c.nodes[ref])
		c.collect(ref, spec, prefix)
	}
	for i, m := range matched {
		if !m {
			c.Unmatched = append(c.Unmatched, i)
		}
	}
	return c
}

// podSpec returns the pod spec of a workload and its field path, or nil:
// a Pod's spec, or the template at spec.template (Deployment, StatefulSet,
// DaemonSet, ReplicaSet, Job, ReplicationController, Argo Rollout, Kruise
// CloneSet, ...) or spec.jobTemplate.spec.template (CronJob). A template
// counts when its spec has a containers list, so that a CRD's unrelated
// "template" field is not mistaken for one.
func podSpec(n *yaml.RNode) (*yaml.RNode, string) {
	if n.GetKind() == "Pod" && n.GetApiVersion() == "v1" {
		if s := field(n, "spec"); s != nil && hasContainers(s) {
			return s, "spec"
		}
		return nil, ""
	}
	for _, p := range templatePaths {
		if s := field(n, p...); s != nil && hasContainers(s) {
			return s, strings.Join(p, ".")
		}
	}
	return nil, ""
}

var templatePaths = [][]string{{"spec", "template", "spec"}, {"spec", "jobTemplate", "spec", "template", "spec"}}

// field walks mapping keys; cheaper than yaml.Lookup, which also parses
// list selectors.
func field(n *yaml.RNode, path ...string) *yaml.RNode {
	for _, k := range path {
		if n.YNode().Kind != yaml.MappingNode {
			return nil
		}
		f := n.Field(k)
		if f == nil {
			return nil
		}
		n = f.Value
	}
	return n
}

func hasContainers(spec *yaml.RNode) bool {
	if spec.YNode().Kind != yaml.MappingNode {
		return false
	}
	c := spec.Field("containers")
	return c != nil && c.Value.YNode().Kind == yaml.SequenceNode
}

// collect adds the images of one pod spec. Ephemeral containers are left
// out: they are added to running pods for debugging, never started from
// the template.
func (c *Collection) collect(ref Ref, spec *yaml.RNode, prefix string) {
	if f := spec.Field("imagePullSecrets"); f != nil && f.Value.YNode().Kind == yaml.SequenceNode {
		var names []string
		for _, s := range f.Value.Content() {
			if s.Kind != yaml.MappingNode {
				continue
			}
			if n := yaml.NewRNode(s).Field("name"); n != nil && n.Value.YNode().Kind == yaml.ScalarNode && n.Value.YNode().Value != "" {
				names = append(names, n.Value.YNode().Value)
			}
		}
		if len(names) > 0 {
			c.PullSecrets = append(c.PullSecrets, PullSecrets{Workload: ref, Path: prefix + ".imagePullSecrets", Names: names})
		}
	}
	for _, list := range []string{"initContainers", "containers"} {
		f := spec.Field(list)
		if f == nil || f.Value.YNode().Kind != yaml.SequenceNode {
			continue
		}
		for i, ctr := range f.Value.Content() {
			c.add(ref, ctr, fmt.Sprintf("%s.%s[%d].image", prefix, list, i), "image")
		}
	}
	if f := spec.Field("volumes"); f != nil && f.Value.YNode().Kind == yaml.SequenceNode {
		for i, vol := range f.Value.Content() {
			if vol.Kind != yaml.MappingNode {
				continue
			}
			img := yaml.NewRNode(vol).Field("image")
			if img == nil || img.Value.YNode().Kind != yaml.MappingNode {
				continue
			}
			c.add(ref, img.Value.YNode(), fmt.Sprintf("%s.volumes[%d].image.reference", prefix, i), "reference")
		}
	}
}

func (c *Collection) add(ref Ref, parent *yaml.Node, path, key string) {
	if parent.Kind != yaml.MappingNode {
		return
	}
	f := yaml.NewRNode(parent).Field(key)
	if f == nil {
		c.Skipped = append(c.Skipped, Skipped{Workload: ref, Path: path})
		return
	}
	v := f.Value.YNode()
	switch {
	case v.Kind != yaml.ScalarNode:
		// Kept, so that the reference check reports it at its path
		// rather than the image being lost.
		c.Images = append(c.Images, Image{Workload: ref, Path: path, NotString: true})
	case v.ShortTag() == yaml.NodeTagNull || strings.TrimSpace(v.Value) == "":
		c.Skipped = append(c.Skipped, Skipped{Workload: ref, Path: path})
	default:
		c.Images = append(c.Images, Image{Ref: strings.TrimSpace(v.Value), Workload: ref, Path: path})
	}
}

// compile checks every field of a selector the way kustomize would use it.
func compile(s v1alpha1.WorkloadSelector) (*types.SelectorRegex, []SelectorError) {
	var errs []SelectorError
	ks := &types.Selector{
		ResId: resid.ResId{
			Gvk:       resid.Gvk{Group: s.Group, Version: s.Version, Kind: s.Kind},
			Name:      s.Name,
			Namespace: s.Namespace,
		},
		LabelSelector:      s.LabelSelector,
		AnnotationSelector: s.AnnotationSelector,
	}
	probe := yaml.NewMapRNode(nil)
	if _, err := probe.MatchesLabelSelector(s.LabelSelector); err != nil {
		errs = append(errs, SelectorError{Field: "labelSelector", Err: fmt.Errorf("%q is not a label selector: %w", s.LabelSelector, err)})
	}
	if _, err := probe.MatchesAnnotationSelector(s.AnnotationSelector); err != nil {
		errs = append(errs, SelectorError{Field: "annotationSelector", Err: fmt.Errorf("%q is not a label selector: %w", s.AnnotationSelector, err)})
	}
	sr, err := types.NewSelectorRegex(ks)
	if err != nil {
		// NewSelectorRegex stops at the first bad field without naming it:
		// find it.
		for _, f := range []struct{ name, val string }{{"group", s.Group}, {"version", s.Version}, {"kind", s.Kind}, {"name", s.Name}, {"namespace", s.Namespace}} {
			one := &types.Selector{}
			switch f.name {
			case "group":
				one.Gvk.Group = f.val
			case "version":
				one.Gvk.Version = f.val
			case "kind":
				one.Gvk.Kind = f.val
			case "name":
				one.Name = f.val
			case "namespace":
				one.Namespace = f.val
			}
			if _, e := types.NewSelectorRegex(one); e != nil {
				errs = append(errs, SelectorError{Field: f.name, Err: fmt.Errorf("%q is not a regular expression: %w", f.val, e)})
			}
		}
	}
	return sr, errs
}

// matches is kustomize's resmap Select for one object: namespace and name
// match the current or the original value, then group/version/kind, then
// the label and annotation selectors.
func matches(n *yaml.RNode, s v1alpha1.WorkloadSelector, sr *types.SelectorRegex) bool {
	cur, org := kustomizeid.Current(n), kustomizeid.Original(n)
	if !sr.MatchNamespace(org.EffectiveNamespace()) && !sr.MatchNamespace(cur.EffectiveNamespace()) {
		return false
	}
	if !sr.MatchName(org.Name) && !sr.MatchName(cur.Name) {
		return false
	}
	if !sr.MatchGvk(cur.Gvk) {
		return false
	}
	// Both were parsed by compile.
	if ok, _ := n.MatchesLabelSelector(s.LabelSelector); !ok {
		return false
	}
	ok, _ := n.MatchesAnnotationSelector(s.AnnotationSelector)
	return ok
}
