package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Severity of a Problem, matching the KRM result severities.
type Severity string

const (
	Error   Severity = "error"
	Warning Severity = "warning"
)

// Problem is one finding about an ImagePrefetcher, tied to a field path.
type Problem struct {
	Severity Severity
	// Path is the field path inside the ImagePrefetcher, e.g.
	// "spec.pull.parallelism" or "spec.images[3]".
	Path    string
	Message string
}

func errorf(path, format string, args ...any) Problem {
	return Problem{Severity: Error, Path: path, Message: fmt.Sprintf(format, args...)}
}

func warnf(path, format string, args ...any) Problem {
	return Problem{Severity: Warning, Path: path, Message: fmt.Sprintf(format, args...)}
}

// Problems is a list of findings.
type Problems []Problem

// HasErrors reports whether any finding is an error.
func (ps Problems) HasErrors() bool {
	for _, p := range ps {
		if p.Severity == Error {
			return true
		}
	}
	return false
}

// Decode reads an ImagePrefetcher strictly: every field that the API does
// not define is reported with its path, instead of being dropped silently.
func Decode(node *yaml.RNode) (*v1alpha1.ImagePrefetcher, Problems) {
	// Straight from the yaml node to plain values and JSON: faster than
	// RNode.MarshalJSON, which prints and re-parses YAML first.
	var generic any
	if err := node.YNode().Decode(&generic); err != nil {
		return nil, Problems{errorf("", "cannot read object: %v", err)}
	}
	raw, err := json.Marshal(generic)
	if err != nil {
		return nil, Problems{errorf("", "cannot read object: %v", err)}
	}
	// yaml.v3 gives map[string]any for string-keyed mappings, which is all
	// the unknown-field walk needs.
	var probs Problems
	unknownFields(generic, reflect.TypeFor[v1alpha1.ImagePrefetcher](), "", &probs)
	if len(probs) > 0 {
		return nil, probs
	}
	var ip v1alpha1.ImagePrefetcher
	if err := json.Unmarshal(raw, &ip); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, Problems{errorf(te.Field, "must be %s, got %s", typeName(te.Type), article(te.Value))}
		}
		return nil, Problems{errorf("", "cannot decode: %v", err)}
	}
	return &ip, nil
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

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// unknownFields walks a decoded JSON value alongside the Go type it will be
// decoded into and reports keys the type has no field for.
func unknownFields(v any, t reflect.Type, path string, probs *Problems) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// Types with their own decoding (Quantity, IntOrString, Time) accept
	// shapes that a struct walk would misjudge.
	if reflect.PointerTo(t).Implements(unmarshalerType) {
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
			unknownFields(m[k], ft, join(path, k), probs)
		}
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return
		}
		for i, e := range s {
			unknownFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), probs)
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
			unknownFields(m[k], t.Elem(), join(path, k), probs)
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
