package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFootprintDependencies keeps out of the binary the packages that made
// the idle agent's resident set more than 20 MiB (docs/agent.md,
// Footprint): client-go's typed clientset, whose scheme registers every
// API group at start-up (agent/kube replaces it), and, in the build that
// `make build` and the Dockerfile make (-tags grpcnotrace), grpc's
// golang.org/x/net/trace, whose html/template keeps the linker from
// dropping unused methods.
func TestFootprintDependencies(t *testing.T) {
	tests := []struct {
		name      string
		tags      string
		forbidden []string // package path prefixes
	}{
		{"any build", "", []string{
			"k8s.io/client-go/kubernetes",
			"k8s.io/client-go/applyconfigurations",
			"k8s.io/client-go/informers",
			"k8s.io/client-go/tools/record",
			"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset",
			"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri",
		}},
		{"make build", "grpcnotrace", []string{
			"k8s.io/client-go/kubernetes",
			"golang.org/x/net/trace",
			"html/template",
		}},
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test lists the binary's packages with the go command, which is not on PATH: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"list", "-deps"}
			if tt.tags != "" {
				args = append(args, "-tags", tt.tags)
			}
			out, err := exec.Command(goTool, append(args, ".")...).Output()
			if err != nil {
				t.Fatalf("go %s: %v", strings.Join(args, " "), err)
			}
			deps := strings.Fields(string(out))
			if len(deps) < 10 {
				t.Fatalf("go list returned %d packages: %q", len(deps), out)
			}
			for _, p := range deps {
				for _, f := range tt.forbidden {
					if p == f || strings.HasPrefix(p, f+"/") {
						t.Errorf("the agent binary depends on %s; see docs/agent.md, Footprint", p)
					}
				}
			}
		})
	}
}
