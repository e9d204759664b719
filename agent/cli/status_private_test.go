package cli

import (
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

func TestPrivateNote(t *testing.T) {
	row := func(node string, insts ...InstanceStatus) NodeStatus { return NodeStatus{Node: node, Instances: insts} }
	with := func(name string, creds bool) InstanceStatus {
		return InstanceStatus{Instance: name, State: "succeeded", Summary: &label.Summary{Credentials: creds}}
	}
	tests := []struct {
		name string
		rows []NodeStatus
		want string // "" or the instances named
	}{
		{"none", []NodeStatus{row("n1", with("web", false))}, ""},
		{"no summary", []NodeStatus{row("n1", InstanceStatus{Instance: "web", State: "missing"})}, ""},
		{"one, on two nodes", []NodeStatus{row("n1", with("web", false), with("private", true)), row("n2", with("private", true))}, "private pull"},
		{"two, sorted", []NodeStatus{row("n1", with("zeta", true), with("alpha", true))}, "alpha, zeta pull"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := privateNote(tt.rows)
			if tt.want == "" {
				if got != "" {
					t.Errorf("got %q, want nothing", got)
				}
				return
			}
			if !strings.HasPrefix(got, "Private images: "+tt.want+" with credentials.") || !strings.Contains(got, "AlwaysVerify") || !strings.HasSuffix(got, "\n") {
				t.Errorf("got %q", got)
			}
		})
	}
}
