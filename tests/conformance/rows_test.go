package conformance

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// namespace holds every generated row's instance.
const namespace = "conformance"

// row is one ImagePrefetcher to render and hold against the apiserver.
type row struct {
	name string // what the row sets, for failure messages
	// doc is the ImagePrefetcher. Its metadata.name is the row's instance
	// name unless alone is set.
	doc map[string]any
	// at: a rejection must name a field at or below this path.
	at string
	// ownName: the row sets metadata.name or metadata.namespace itself, so
	// it keeps its name (unique among the rows) instead of getting one.
	ownName bool
	// alone: rendered in a kustomization of its own, which differs.
	alone bool
	// kustomization lines added to a lone row's kustomization (namePrefix,
	// namespace), and generator mode instead of transformer mode.
	kustomization string
	generator     bool
}

func baseDoc(name string) map[string]any {
	return map[string]any{
		"apiVersion": v1alpha1.APIVersion,
		"kind":       v1alpha1.Kind,
		"metadata":   map[string]any{"name": name, "namespace": namespace},
		"spec":       map[string]any{"images": []any{"busybox:1.37"}},
	}
}

// Boundary values by type. Strings cover names, keys, paths, durations and
// the enumerations of the Kubernetes types; every string field gets all of
// them, so a new field is covered the day it is added.
var (
	stringPool = []any{
		"", "a", "A", "-a", "a.b", "a_b", "a/b", "a/b/c", "bad key!", " a",
		strings.Repeat("x", 63), strings.Repeat("x", 64), strings.Repeat("x", 253), strings.Repeat("x", 254),
		"example.com/" + strings.Repeat("x", 63), "example.com/" + strings.Repeat("x", 64),
		"/abs/path", "/", "/a/../b", "rel/path", "/tmp/x.sock", "/etc/image-prefetcher/x", "/run/containerd",
		"0", "-1", "10ms", "1m", "1.5h", "101%",
		"Exists", "Equal", "In", "Gt", "NoExecute", "kubernetes.io/hostname", "metadata.name",
		"ocp", "crio", "Always", "busybox", "Busybox:1", "registry.example.com:5000/a/b@sha256:" + strings.Repeat("a", 64),
	}
	boolPool = []any{true, false, "true"}
	intPool  = []any{-1, 0, 1, 2, 64, 65, 100, 101, 1000, 1001, 2147483647, 2147483648, "1"}
	// quantityPool: JSON numbers and strings.
	quantityPool     = []any{-1, 0, 1, 0.5, "0", "1", "-1", "100m", "0.5", "1Mi", "-1Mi", "1e3", "1.5Gi", "2Mi", "1Gi", "lots", ""}
	intOrStringPool  = []any{-1, 0, 1, 5, "0", "0%", "1%", "50%", "100%", "101%", "x", "1"}
	resourceNamePool = []any{
		"cpu", "memory", "ephemeral-storage", "storage", "pods", "gpu", "hugepages-2Mi", "hugepages-1Gi", "hugepages-x",
		"nvidia.com/gpu", "example.com/dev", "kubernetes.io/x", "requests.cpu", "example.com/Bad_", "a/b/c",
	}
)

// seeds are the smallest valid values of types whose fields depend on one
// another, so that a row setting one field tests that field and not a
// missing sibling. Types without a seed start empty.
var seeds = map[reflect.Type]func() any{
	reflect.TypeFor[corev1.NodeSelectorRequirement]():  func() any { return map[string]any{"key": "k", "operator": "Exists"} },
	reflect.TypeFor[metav1.LabelSelectorRequirement](): func() any { return map[string]any{"key": "k", "operator": "Exists"} },
	reflect.TypeFor[corev1.PodAffinityTerm]():          func() any { return map[string]any{"topologyKey": "kubernetes.io/hostname"} },
	reflect.TypeFor[corev1.WeightedPodAffinityTerm](): func() any {
		return map[string]any{"weight": 1, "podAffinityTerm": map[string]any{"topologyKey": "kubernetes.io/hostname"}}
	},
	reflect.TypeFor[corev1.PreferredSchedulingTerm](): func() any { return map[string]any{"weight": 1, "preference": map[string]any{}} },
	reflect.TypeFor[corev1.NodeSelector]():            func() any { return map[string]any{"nodeSelectorTerms": []any{map[string]any{}}} },
	reflect.TypeFor[corev1.Toleration]():              func() any { return map[string]any{"operator": "Exists"} },
	reflect.TypeFor[v1alpha1.CredentialProvider](): func() any {
		return map[string]any{"configPath": "/etc/kubernetes/credential-provider.yaml", "binDir": "/usr/libexec/kubernetes/credential-provider"}
	},
	reflect.TypeFor[v1alpha1.ConfigMapKeyRef](): func() any { return map[string]any{"name": "images", "key": "images.txt"} },
	reflect.TypeFor[v1alpha1.ImageListSource](): func() any {
		return map[string]any{"configMapRef": map[string]any{"name": "images", "key": "images.txt"}}
	},
}

// elementSeeds override seeds for the elements of a list field, where the
// same type means something else: a node field selector can only be
// metadata.name In one node.
var elementSeeds = map[string]func() any{
	"matchFields": func() any {
		return map[string]any{"key": "metadata.name", "operator": "In", "values": []any{"node-1"}}
	},
}

func seedOf(t reflect.Type) any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if f, ok := seeds[t]; ok {
		return f()
	}
	switch t.Kind() {
	case reflect.Slice:
		return []any{}
	case reflect.Map, reflect.Struct:
		return map[string]any{}
	}
	return nil
}

// step is one element of a path into the document: a JSON field name, or
// the first element of a list (index true).
type step struct {
	name  string
	index bool
	typ   reflect.Type // the type the step leads to
}

func pathString(root string, steps []step) string {
	s := root
	for _, st := range steps {
		if st.index {
			s += "[0]"
		} else {
			s += "." + st.name
		}
	}
	return s
}

var (
	quantityType    = reflect.TypeFor[resource.Quantity]()
	intOrStringType = reflect.TypeFor[intstr.IntOrString]()
	resourceList    = reflect.TypeFor[corev1.ResourceList]()
)

// typeRows walks t (the type at path steps under doc[root]) and adds one
// row per boundary value of every leaf, and the empty value of every list
// and object. A field of a kind it has no values for is listed in
// uncovered, so that a new field of a new shape fails the test instead of
// going untested.
func typeRows(rows *[]row, uncovered *[]string, root string, steps []step, t reflect.Type, depth int) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if depth > 12 {
		*uncovered = append(*uncovered, pathString(root, steps)+" (nested too deep)")
		return
	}
	leaf := func(values []any) {
		for _, v := range values {
			*rows = append(*rows, setRow(root, steps, v))
		}
	}
	switch {
	case t == quantityType:
		leaf(quantityPool)
		return
	case t == intOrStringType:
		leaf(intOrStringPool)
		return
	case t == resourceList:
		mapRows(rows, root, steps, resourceNamePool, "1", []any{"cpu", "nvidia.com/gpu", "hugepages-2Mi"}, quantityPool)
		return
	case t == reflect.TypeFor[metav1.Time]():
		return
	}
	switch t.Kind() {
	case reflect.String:
		leaf(stringPool)
	case reflect.Bool:
		leaf(boolPool)
	case reflect.Int, reflect.Int32, reflect.Int64:
		leaf(intPool)
	case reflect.Struct:
		if len(steps) > 0 {
			leaf([]any{map[string]any{}})
		}
		for _, f := range jsonFields(t) {
			typeRows(rows, uncovered, root, append(slicesClone(steps), step{name: f.name, typ: f.typ}), f.typ, depth+1)
		}
	case reflect.Slice:
		leaf([]any{[]any{}})
		typeRows(rows, uncovered, root, append(slicesClone(steps), step{index: true, typ: t.Elem()}), t.Elem(), depth+1)
	case reflect.Map:
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			mapRows(rows, root, steps, stringPool, "v", []any{"k"}, stringPool)
			return
		}
		*uncovered = append(*uncovered, fmt.Sprintf("%s (%s)", pathString(root, steps), t))
	default:
		*uncovered = append(*uncovered, fmt.Sprintf("%s (%s)", pathString(root, steps), t))
	}
}

// mapRows: entries with each key of keys (and a valid value), and with each
// value of values under a few valid keys.
func mapRows(rows *[]row, root string, steps []step, keys []any, okValue any, okKeys []any, values []any) {
	for _, k := range keys {
		*rows = append(*rows, setRow(root, steps, map[string]any{fmt.Sprint(k): okValue}))
	}
	for _, k := range okKeys {
		for _, v := range values {
			*rows = append(*rows, setRow(root, steps, map[string]any{fmt.Sprint(k): v}))
		}
	}
}

func setRow(root string, steps []step, v any) row {
	name := pathString(root, steps) + "=" + short(v)
	// A finding may name any field of the object that holds the leaf: a
	// value is often judged together with its siblings (an operator and
	// its values, tolerationSeconds and the effect).
	n := len(steps)
	for n > 0 && steps[n-1].index {
		n--
	}
	if n > 1 {
		n--
	}
	at := pathString(root, steps[:n])
	return row{name: name, at: at}.with(func(doc map[string]any) { set(doc, root, steps, v) })
}

func short(v any) string {
	b, _ := json.Marshal(v)
	s := string(b)
	if len(s) > 40 {
		s = fmt.Sprintf("%s…(%d bytes)", s[:30], len(s))
	}
	return s
}

// with records how to build the row's document from the base.
func (r row) with(edit func(map[string]any)) row {
	doc := baseDoc("")
	edit(doc)
	r.doc = doc
	return r
}

// set puts v at steps under doc[root], creating seeds on the way.
func set(doc map[string]any, root string, steps []step, v any) {
	if len(steps) == 0 {
		doc[root] = v
		return
	}
	cur := doc[root]
	var put func(any)
	put = func(x any) { doc[root] = x }
	for i, st := range steps {
		last := i == len(steps)-1
		if st.index {
			list, _ := cur.([]any)
			if len(list) == 0 {
				seed := seedOf(st.typ)
				if i > 0 {
					if f, ok := elementSeeds[steps[i-1].name]; ok {
						seed = f()
					}
				}
				list = []any{seed}
				put(list)
			}
			if last {
				list[0] = v
				return
			}
			cur, put = list[0], func(x any) { list[0] = x }
			continue
		}
		m, ok := cur.(map[string]any)
		if !ok {
			m = map[string]any{}
			put(m)
		}
		if last {
			m[st.name] = v
			return
		}
		next, ok := m[st.name]
		if !ok || next == nil {
			next = seedOf(st.typ)
			m[st.name] = next
		}
		name := st.name
		cur, put = next, func(x any) { m[name] = x }
	}
}

type jsonField struct {
	name string
	typ  reflect.Type
}

// jsonFields lists the JSON fields of a struct, inlined structs flattened,
// in a fixed order.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if (f.Anonymous && name == "") || strings.Contains(opts, "inline") {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{name, f.Type})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func slicesClone(s []step) []step { return append([]step(nil), s...) }

// generatedRows: every field of the Spec, down through the Kubernetes types
// it embeds, at its boundary values; and the fields it has no values for.
func generatedRows() (rows []row, uncovered []string) {
	typeRows(&rows, &uncovered, "spec", nil, reflect.TypeFor[v1alpha1.Spec](), 0)
	// The metadata the function reads: labels are copied to every object.
	for _, field := range []string{"labels", "annotations"} {
		n := len(rows)
		mapRows(&rows, "metadata", []step{{name: field, typ: reflect.TypeFor[map[string]string]()}}, stringPool, "v", []any{"team"}, stringPool)
		for i := n; i < len(rows); i++ {
			rows[i].at = "metadata." + field
		}
	}
	// Names and namespaces: every string. Rows are told apart by name, so
	// each namespace row gets a name of its own.
	for i, v := range stringPool {
		s := v.(string)
		rows = append(rows, row{name: "metadata.name=" + short(s), at: "metadata.name", ownName: true, alone: s == ""}.with(func(d map[string]any) { d["metadata"].(map[string]any)["name"] = s }))
		rows = append(rows, row{name: "metadata.namespace=" + short(s), at: "metadata.namespace", ownName: true}.with(func(d map[string]any) {
			d["metadata"].(map[string]any)["name"] = fmt.Sprintf("n%04d", i)
			d["metadata"].(map[string]any)["namespace"] = s
		}))
	}
	return rows, uncovered
}
