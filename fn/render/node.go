package render

import (
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/kio/filters"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// toNode turns a typed object into a block-style YAML node in the field
// order of its Go type, without the empty and null fields the Kubernetes
// types always marshal (creationTimestamp: null, status: {}, resources: {}).
func toNode(obj any) (*yaml.RNode, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("re-read as YAML: %w", err)
	}
	root := doc.Content[0]
	prune(root, "")
	removeKey(root, "status")
	restyle(root)
	// Field order as kubectl and kustomize print it (apiVersion, kind,
	// metadata, spec; name, image, args, ... in containers).
	out, err := filters.FormatFilter{}.Filter([]*yaml.RNode{yaml.NewRNode(root)})
	if err != nil {
		return nil, fmt.Errorf("format: %w", err)
	}
	return out[0], nil
}

// prune drops null values and empty maps and lists. An empty map is kept
// where it means something: "emptyDir: {}" is a volume.
func prune(n *yaml.Node, key string) (empty bool) {
	switch n.Kind {
	case yaml.MappingNode:
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if prune(v, k.Value) {
				continue
			}
			kept = append(kept, k, v)
		}
		n.Content = kept
		return len(n.Content) == 0 && key != "emptyDir"
	case yaml.SequenceNode:
		kept := n.Content[:0]
		for _, e := range n.Content {
			if e.Kind == yaml.ScalarNode && e.Tag == "!!null" {
				continue
			}
			prune(e, "")
			kept = append(kept, e)
		}
		n.Content = kept
		return len(n.Content) == 0
	case yaml.ScalarNode:
		return n.Tag == "!!null"
	}
	return false
}

func removeKey(n *yaml.Node, key string) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content = append(n.Content[:i], n.Content[i+2:]...)
			return
		}
	}
}

// restyle turns JSON's flow style and double quotes into the block style
// kubectl and kustomize print; the encoder re-adds quotes where a plain
// scalar would change type.
func restyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.Contains(n.Value, "\n") {
		n.Style = yaml.LiteralStyle
	}
	for _, c := range n.Content {
		restyle(c)
	}
}
