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
	prune(root, "", false)
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

// userFields are the paths (in the rendered object, "[]" for any list
// index) of the fields copied from the ImagePrefetcher as the user wrote
// them. An empty map or list there can mean something the absent field does
// not: "labelSelector: {}" selects every pod, while no labelSelector selects
// none.
var userFields = map[string]bool{
	"spec.template.spec.affinity":                   true,
	"spec.template.spec.tolerations":                true,
	"spec.template.spec.nodeSelector":               true,
	"spec.template.spec.initContainers[].resources": true,
	"spec.template.spec.containers[].resources":     true,
}

// prune drops null values, and the empty maps and lists that the Kubernetes
// types marshal for fields the function left unset. An empty map is kept
// where it means something: "emptyDir: {}" is a volume, and in the user's
// own fields (userFields) only nulls go, which JSON cannot tell from unset.
func prune(n *yaml.Node, path string, user bool) (empty bool) {
	user = user || userFields[path]
	switch n.Kind {
	case yaml.MappingNode:
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if prune(v, join(path, k.Value), user) {
				continue
			}
			kept = append(kept, k, v)
		}
		n.Content = kept
		return len(n.Content) == 0 && !user && !strings.HasSuffix(path, ".emptyDir")
	case yaml.SequenceNode:
		kept := n.Content[:0]
		for _, e := range n.Content {
			if e.Kind == yaml.ScalarNode && e.Tag == "!!null" {
				continue
			}
			prune(e, path+"[]", user)
			kept = append(kept, e)
		}
		n.Content = kept
		return len(n.Content) == 0 && !user
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
