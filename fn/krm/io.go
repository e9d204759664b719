package krm

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Run reads a ResourceList, runs the Processor and writes the result.
//
// It does not use fn.Run/fn.AsMain for the output: the SDK sorts items by
// apiVersion, kind, namespace and name before writing, which reorders
// items this function must pass through untouched. Here items keep their
// order and their yaml nodes (comments, quoting and styles included), and
// are written with kyaml's encoder, the one kpt and kustomize use to write
// the input, so canonical input comes back byte for byte.
func Run(in []byte) ([]byte, fn.Results, error) {
	rl, err := fn.ParseResourceList(in)
	if err != nil {
		return nil, nil, fmt.Errorf("read ResourceList: %w", err)
	}
	if _, err := Processor.Process(rl); err != nil {
		return nil, nil, fmt.Errorf("process: %w", err)
	}
	out, err := Write(rl)
	if err != nil {
		return nil, rl.Results, fmt.Errorf("write ResourceList: %w", err)
	}
	return out, rl.Results, nil
}

// Write serializes rl without reordering its items.
func Write(rl *fn.ResourceList) ([]byte, error) {
	root := yaml.NewMapRNode(nil)
	if err := root.PipeE(yaml.SetField("apiVersion", yaml.NewScalarRNode(kio.ResourceListAPIVersion))); err != nil {
		return nil, err
	}
	if err := root.PipeE(yaml.SetField("kind", yaml.NewScalarRNode(kio.ResourceListKind))); err != nil {
		return nil, err
	}
	items := yaml.NewListRNode()
	for _, ko := range rl.Items {
		items.YNode().Content = append(items.YNode().Content, ko.MoveToResourceNode().YNode())
	}
	if err := root.PipeE(yaml.SetField("items", items)); err != nil {
		return nil, err
	}
	if rl.FunctionConfig != nil && !rl.FunctionConfig.IsEmpty() {
		if err := root.PipeE(yaml.SetField("functionConfig", rl.FunctionConfig.CopyToResourceNode())); err != nil {
			return nil, err
		}
	}
	if len(rl.Results) > 0 {
		b, err := yaml.Marshal(rl.Results)
		if err != nil {
			return nil, fmt.Errorf("marshal results: %w", err)
		}
		res, err := yaml.Parse(string(b))
		if err != nil {
			return nil, fmt.Errorf("re-read results: %w", err)
		}
		if err := root.PipeE(yaml.SetField("results", res)); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(root.YNode()); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Describe is the one-line, human-readable form of a result, for stderr:
// kustomize shows a failing function's stderr and nothing else.
func Describe(r *fn.Result) string {
	var b strings.Builder
	b.WriteString(string(r.Severity))
	b.WriteString(": ")
	if ref := r.ResourceRef; ref != nil {
		b.WriteString(ref.Kind)
		b.WriteString(" ")
		if ref.Namespace != "" {
			b.WriteString(ref.Namespace + "/")
		}
		b.WriteString(ref.Name)
		if r.File != nil && r.File.Path != "" {
			fmt.Fprintf(&b, " (%s)", r.File.Path)
		}
		b.WriteString(": ")
	}
	if r.Field != nil && r.Field.Path != "" {
		b.WriteString(r.Field.Path + ": ")
	}
	b.WriteString(strings.ReplaceAll(r.Message, "\n", " "))
	return b.String()
}
