package cli

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// GateConfig is what a herd-control gate needs to know.
type GateConfig struct {
	// Kube is nil when the agent runs without an API client.
	Kube      kube.Interface
	Namespace string
	Pod       string
	Node      string
	Instance  string
	// MaxConcurrentNodes is --max-concurrent-nodes; 0 means no limit.
	MaxConcurrentNodes int
	// SeedNodes is --seed-nodes.
	SeedNodes int
	// SeedKey names what is seeded, for example a digest of the image
	// list, so that a new list is seeded again. Empty: any finished seed
	// counts.
	SeedKey string
	// ReleaseGrace bounds giving a slot back once the run was terminated.
	ReleaseGrace time.Duration
	Log          *slog.Logger
}

// NewGate is the herd-control seam: with --max-concurrent-nodes=K > 0 a
// node pulls only while it holds one of K Lease slots (see agent/slots);
// with 0, it returns no gate.
func NewGate(ctx context.Context, cfg GateConfig) (pull.Gate, error) {
	if cfg.MaxConcurrentNodes == 0 {
		if cfg.SeedNodes > 0 {
			return nil, errors.New("--seed-nodes needs --max-concurrent-nodes")
		}
		return nil, nil
	}
	if cfg.Kube == nil {
		return nil, errors.New("--max-concurrent-nodes needs a Kubernetes API client")
	}
	g, err := slots.New(slots.Config{
		Client:       cfg.Kube.Leases(cfg.Namespace),
		Namespace:    cfg.Namespace,
		Instance:     cfg.Instance,
		Slots:        cfg.MaxConcurrentNodes,
		SeedNodes:    cfg.SeedNodes,
		SeedKey:      cfg.SeedKey,
		Identity:     cmp.Or(cfg.Pod, cfg.Node),
		ReleaseGrace: cfg.ReleaseGrace,
		Logger:       cfg.Log,
	})
	if err != nil {
		return nil, err
	}
	return slotGate{g}, nil
}

// slotGate is the slots' Gate as the puller sees it.
type slotGate struct{ *slots.Gate }

func (g slotGate) Hold(ctx context.Context) (pull.Slot, error) {
	h, err := g.Gate.Hold(ctx)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// releaseGrace is how long giving back a slot may hold up watch's
// shutdown: it has 5 s after SIGTERM in all, and removing the label needs
// the rest. A slot not cleared in time frees itself after the lease
// duration.
const releaseGrace = time.Second
