package cli

import (
	"context"
	"log/slog"

	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// GateConfig is what a herd-control gate needs to know.
type GateConfig struct {
	// Kube is nil when the agent runs without an API client.
	Kube      kubernetes.Interface
	Namespace string
	Pod       string
	Node      string
	Instance  string
	// MaxConcurrentNodes is --max-concurrent-nodes; 0 means no limit.
	MaxConcurrentNodes int
	// SeedNodes is --seed-nodes.
	SeedNodes int
	Log       *slog.Logger
}

// NewGate is the herd-control seam: --max-concurrent-nodes and --seed-nodes
// are accepted and passed here. Until Lease slots are wired in, every node
// may pull at once.
func NewGate(_ context.Context, _ GateConfig) (pull.Gate, error) {
	return pull.NoGate{}, nil
}
