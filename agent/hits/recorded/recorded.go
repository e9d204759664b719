// Package recorded reads and writes the Events recorded from a real
// kubelet, agent and apiserver (agent/hits/testdata/recorded.json).
// tests/hits records them with -update and checks that the kubelet still
// words them so; agent/hits' unit tests run on them.
package recorded

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Recording is one run of tests/hits' TestHitsView.
type Recording struct {
	Instance  string `json:"instance"`
	Namespace string `json:"namespace"`
	DaemonSet string `json:"daemonSet"`
	// List is the instance's list ConfigMap's text when the pods started.
	List string `json:"list"`
	// Node is the node's metadata, with the instance's label and
	// annotation only.
	Node metav1.ObjectMeta `json:"node"`
	// Kubelet are the kubelet's Pulled and Pulling Events of every
	// namespace; Agent the agent's Events in the instance's namespace.
	Kubelet []corev1.Event `json:"kubelet"`
	Agent   []corev1.Event `json:"agent"`
}

// Path is the recording's file, found from the working directory up (go
// test runs in the package's directory; -trimpath builds have no source
// path to go by).
func Path() string {
	rel := filepath.Join("agent", "hits", "testdata", "recorded.json")
	dir, err := os.Getwd()
	if err != nil {
		return rel
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return rel
		}
		dir = parent
	}
}

// Read reads the recording.
func Read() (Recording, error) {
	var r Recording
	b, err := os.ReadFile(Path())
	if err != nil {
		return r, fmt.Errorf("%w (go test ./tests/hits -update records it)", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", Path(), err)
	}
	return r, nil
}

// Write writes the recording, without the Events' managed fields.
func Write(r Recording) error {
	for _, evs := range [][]corev1.Event{r.Kubelet, r.Agent} {
		for i := range evs {
			evs[i].ManagedFields = nil
		}
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(Path(), append(b, '\n'), 0o644)
}
