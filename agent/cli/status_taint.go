package cli

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/taint"
)

// addTaints fills in each instance's startup-taint state. The key is
// --startup-taint when given; otherwise the one any node's summary of the
// instance records, which also covers the nodes still pulling, whose agent
// has written no summary yet.
func addTaints(rows []NodeStatus, nodes []corev1.Node, flagKey string) {
	keys := map[string]string{}
	for _, r := range rows {
		for _, i := range r.Instances {
			if s := i.Summary; s != nil && s.StartupTaint != "" {
				keys[i.Instance] = s.StartupTaint
			}
		}
	}
	byName := map[string]*corev1.Node{}
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	for _, r := range rows {
		for j := range r.Instances {
			i := &r.Instances[j]
			key := flagKey
			if key == "" {
				key = keys[i.Instance]
			}
			if key == "" {
				continue
			}
			i.StartupTaint = &TaintState{Key: key, Present: taint.Has(byName[r.Node], key)}
		}
	}
}

func hasTaints(rows []NodeStatus) bool {
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.StartupTaint != nil {
				return true
			}
		}
	}
	return false
}

func taintCell(t *TaintState) string {
	switch {
	case t == nil:
		return "-"
	case t.Present:
		return "present"
	}
	return "absent"
}
