package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Findings are kyaml's framework.Results, the type the ResourceList
// carries them in. Field.Path is a path inside the ImagePrefetcher, e.g.
// "spec.pull.parallelism" or "spec.images[3]"; ResourceRef is set only for
// a finding about another object (a workload the ImagePrefetcher
// selected), and Field.Path is then a path in that object. The caller
// fills in the ImagePrefetcher's reference and file.

// errorf is an error at path.
func errorf(path, format string, args ...any) *framework.Result {
	return &framework.Result{Severity: framework.Error, Field: &framework.Field{Path: path},
		Message: fmt.Sprintf(format, args...)}
}

// warnf is a warning at path.
func warnf(path, format string, args ...any) *framework.Result {
	return &framework.Result{Severity: framework.Warning, Field: &framework.Field{Path: path},
		Message: fmt.Sprintf(format, args...)}
}

// Decode reads an ImagePrefetcher strictly: every field that the API does
// not define is reported with its path, instead of being dropped silently.
//
// Not sigs.k8s.io/json's UnmarshalStrict, measured on the error goldens:
// a duplicate key never reaches it (yaml.v3 refuses one first, by line in
// the ResourceList, not by path); it stops at the first wrong type, names
// it without list indices or map keys ("spec.nodeSelector"), a Quantity's
// not at all ("spec: cannot decode: quantities must match ..."), and then
// reports no unknown field. 6 error goldens came out worse; the walk here
// finds every unknown field and wrong value in one pass.
func Decode(node *yaml.RNode) (*v1alpha1.ImagePrefetcher, framework.Results) {
	// Duplicate and non-string keys first: the decoder below reports them
	// by line only, and JSON cannot hold a non-string key at all.
	var probs framework.Results
	checkKeys(node.YNode(), "", &probs)
	if len(probs) > 0 {
		return nil, probs
	}
	// Straight from the yaml node to plain values and JSON: faster than
	// RNode.MarshalJSON, which prints and re-parses YAML first.
	var generic any
	if err := node.YNode().Decode(&generic); err != nil {
		// A value the decoder cannot read at all (say "!!int abc"): find
		// which one, now that speed no longer matters.
		path, err := locateDecodeError(node.YNode(), "", err)
		return nil, framework.Results{errorf(cmpOr(path, "metadata"), "cannot be read: %v", err)}
	}
	normalizeDurations(generic, &probs)
	// yaml.v3 gives map[string]any for string-keyed mappings, which is all
	// the field walk needs.
	checkFields(generic, reflect.TypeFor[v1alpha1.ImagePrefetcher](), "", &probs)
	if len(probs) > 0 {
		return nil, probs
	}
	raw, err := json.Marshal(generic)
	if err != nil {
		return nil, framework.Results{errorf("spec", "cannot read object: %v", err)}
	}
	var ip v1alpha1.ImagePrefetcher
	if err := json.Unmarshal(raw, &ip); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, framework.Results{errorf(cmpOr(te.Field, "spec"), "must be %s, got %s", typeName(te.Type), article(te.Value))}
		}
		// checkFields has tried every value with its own decoder, so this
		// is not expected; "spec" is the closest path there is.
		return nil, framework.Results{errorf("spec", "cannot decode: %v", err)}
	}
	return &ip, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkKeys reports keys that appear twice in one mapping (tools disagree
// on which one counts: yaml.v3 refuses, others keep the first or the last)
// and keys that are not strings, with the path of the key.
func checkKeys(n *yaml.Node, path string, probs *framework.Results) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			checkKeys(c, path, probs)
		}
	case yaml.MappingNode:
		// Line numbers would point into the ResourceList the orchestrator
		// built, not into the user's file; the path is what helps.
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || (k.ShortTag() != yaml.NodeTagString && k.ShortTag() != "!!merge") {
				*probs = append(*probs, errorf(join(path, k.Value), "the key %s is not a string: quote it", k.Value))
				continue
			}
			if seen[k.Value] {
				*probs = append(*probs, errorf(join(path, k.Value), "is set twice: each key may appear once in a mapping"))
				continue
			}
			seen[k.Value] = true
			checkKeys(v, join(path, k.Value), probs)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			checkKeys(c, fmt.Sprintf("%s[%d]", path, i), probs)
		}
	}
}

// locateDecodeError returns the path of the first scalar under n that does
// not decode on its own, and its error; the whole-object error otherwise.
func locateDecodeError(n *yaml.Node, path string, whole error) (string, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) > 0 {
			return locateDecodeError(n.Content[0], path, whole)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if p, err := locateDecodeError(n.Content[i+1], join(path, n.Content[i].Value), nil); err != nil {
				return p, err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if p, err := locateDecodeError(c, fmt.Sprintf("%s[%d]", path, i), nil); err != nil {
				return p, err
			}
		}
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return path, err
		}
	}
	return "", whole
}

// durationFields are the paths of the API's duration strings.
var durationFields = [][]string{
	{"spec", "refreshInterval"},
	{"spec", "pull", "initialAttemptTimeout"},
	{"spec", "pull", "maxAttemptTimeout"},
	{"spec", "pull", "overallTimeout"},
	{"spec", "pull", "initialRetryDelay"},
	{"spec", "pull", "maxRetryDelay"},
	{"spec", "startupTaint", "maxWait"},
}

// normalizeDurations accepts an unquoted 0 in a duration field as "0":
// zero needs no unit, and YAML reads it as a number. Validate then decides
// whether zero is allowed there. Any other bare number is ambiguous
// (seconds? minutes?) and is reported with a hint instead of a type error.
func normalizeDurations(generic any, probs *framework.Results) {
	for _, fp := range durationFields {
		m, ok := generic.(map[string]any)
		for _, k := range fp[:len(fp)-1] {
			if !ok {
				break
			}
			m, ok = m[k].(map[string]any)
		}
		if !ok {
			continue
		}
		last := fp[len(fp)-1]
		switch v := m[last].(type) {
		case int:
			if v == 0 {
				m[last] = "0"
				continue
			}
			*probs = append(*probs, errorf(strings.Join(fp, "."), "%d has no unit: write a Go duration such as %ds or %dm (only 0 may go without one)", v, v, v))
			delete(m, last) // reported: the field walk need not see it again
		case float64:
			if v == 0 {
				m[last] = "0" // 0.0 is zero too
				continue
			}
			*probs = append(*probs, errorf(strings.Join(fp, "."), "%v has no unit: write a Go duration such as 90s, 5m or 1h30m (only 0 may go without one)", v))
			delete(m, last)
		}
	}
}

func article(s string) string {
	if s != "" && strings.ContainsRune("aeiou", rune(s[0])) {
		return "an " + s
	}
	return "a " + s
}

func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

var (
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	quantityType    = reflect.TypeFor[resource.Quantity]()
	intOrStringType = reflect.TypeFor[intstr.IntOrString]()
)

// checkFields walks a decoded JSON value alongside the Go type it will be
// decoded into and reports keys the type has no field for, and values that
// a type with its own decoder rejects, each with its path: json.Unmarshal
// reports those without one.
func checkFields(v any, t reflect.Type, path string, probs *framework.Results) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// Types with their own decoding (Quantity, IntOrString, Time) accept
	// shapes that a struct walk would misjudge: try the value on its own.
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		if v == nil {
			return
		}
		b, err := json.Marshal(v)
		if err == nil {
			err = json.Unmarshal(b, reflect.New(t).Interface())
		}
		switch {
		case err == nil:
		case t == intOrStringType:
			*probs = append(*probs, errorf(path, "must be an integer or a string, got %s", b))
		case t == quantityType:
			*probs = append(*probs, errorf(path, "%s is not a quantity: write a number with an optional unit, such as 250m, 2, 64Mi or 1Gi", b))
		default:
			*probs = append(*probs, errorf(path, "%s is not valid here: %v", b, err))
		}
		return
	}
	if msg := scalarMismatch(v, t); msg != "" {
		*probs = append(*probs, errorf(path, "%s", msg))
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return // a type mismatch; json.Unmarshal reports it with its path
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				*probs = append(*probs, errorf(join(path, k), "unknown field %q", k))
				continue
			}
			checkFields(m[k], ft, join(path, k), probs)
		}
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return
		}
		for i, e := range s {
			checkFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), probs)
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			checkFields(m[k], t.Elem(), join(path, k), probs)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// jsonFields maps JSON names to field types, flattening embedded and
// ",inline" structs the way encoding/json and the Kubernetes types do.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if (f.Anonymous && name == "") || strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					out[k] = v
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// scalarMismatch returns why the YAML value v cannot be decoded into the
// scalar type t, with the value itself and the fix, or "". encoding/json
// would say only "must be an integer" at the nearest struct field, and
// not at a map's key or on an int32 overflow.
func scalarMismatch(v any, t reflect.Type) string {
	if v == nil {
		return "" // null: the zero value, as in the apiserver
	}
	got := func() string {
		switch x := v.(type) {
		case string:
			return fmt.Sprintf("the string %q", x)
		case bool:
			return fmt.Sprintf("the boolean %v", x)
		case int, int64, uint64, float64:
			return fmt.Sprintf("the number %v", x)
		case []any:
			return "a list"
		case map[string]any:
			return "an object"
		}
		return fmt.Sprintf("%v", v)
	}
	switch t.Kind() {
	case reflect.String:
		switch x := v.(type) {
		case string:
			return ""
		case bool, int, int64, uint64, float64:
			return fmt.Sprintf("must be a string, got %s: quote it, as \"%v\"", got(), x)
		}
		return "must be a string, got " + got()
	case reflect.Bool:
		if _, ok := v.(bool); ok {
			return ""
		}
		return "must be true or false, got " + got()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var n int64
		switch x := v.(type) {
		case int:
			n = int64(x)
		case int64:
			n = x
		case uint64:
			return fmt.Sprintf("%d is too large: at most %d", x, int64(1)<<(t.Bits()-1)-1)
		case float64:
			return fmt.Sprintf("must be a whole number, got %v", x)
		case string:
			return fmt.Sprintf("must be a whole number, got %s: drop the quotes if it is one", got())
		default:
			return "must be a whole number, got " + got()
		}
		lo, hi := -(int64(1) << (t.Bits() - 1)), int64(1)<<(t.Bits()-1)-1
		if n < lo || n > hi {
			return fmt.Sprintf("%d is out of range: it must be between %d and %d", n, lo, hi)
		}
	}
	return ""
}
