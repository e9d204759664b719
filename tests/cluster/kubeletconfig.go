package cluster

import (
	"fmt"
	"maps"

	"sigs.k8s.io/yaml"
)

// withFields returns the YAML document doc with the top-level fields of
// fields replaced (or added).
func withFields(doc string, fields map[string]any) (string, error) {
	if len(fields) == 0 {
		return doc, nil
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		return "", fmt.Errorf("parse: %w", err)
	}
	maps.Copy(m, fields)
	out, err := yaml.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encode: %w", err)
	}
	return string(out), nil
}
