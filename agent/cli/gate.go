package cli

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/coverage"
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
	Log     *slog.Logger
}

// NewGate is the herd-control seam: with --max-concurrent-nodes=K > 0 a
// node pulls only while it holds one of K Lease slots (see agent/slots).
func NewGate(ctx context.Context, cfg GateConfig) (pull.Gate, error) {
	if cfg.MaxConcurrentNodes == 0 {
		if cfg.SeedNodes > 0 {
			return nil, errors.New("--seed-nodes needs --max-concurrent-nodes")
		}
		return pull.NoGate{}, nil
	}
	if cfg.Kube == nil {
		return nil, errors.New("--max-concurrent-nodes needs a Kubernetes API client")
	}
	g, err := slots.New(slots.Config{
		Client:    cfg.Kube.Leases(cfg.Namespace),
		Namespace: cfg.Namespace,
		Instance:  cfg.Instance,
		Slots:     cfg.MaxConcurrentNodes,
		SeedNodes: cfg.SeedNodes,
		SeedKey:   cfg.SeedKey,
		Herd:      HerdSize(ctx, cfg.Kube, cfg.Namespace, cfg.Pod, cfg.Log),
		Identity:  cmp.Or(cfg.Pod, cfg.Node),
		Logger:    cfg.Log,
	})
	if err != nil {
		return nil, err
	}
	return slotGate{g}, nil
}

// herdTimeout bounds reading the herd's size: it only tunes the wait.
const herdTimeout = 5 * time.Second

// HerdSize is how many pods the agent's DaemonSet wants (its status's
// desiredNumberScheduled): the most nodes that may wait for a pull slot at
// once, from which a waiter sizes the part of the slots it watches
// (agent/slots). 0 when it cannot be told: outside a DaemonSet's pod, or
// the read fails; the waiters then find the size themselves.
func HerdSize(ctx context.Context, k kube.Interface, namespace, pod string, log *slog.Logger) int {
	getter, ok := k.(kube.DaemonSetGetter)
	name, named := coverage.DaemonSetName(pod)
	if !ok || !named || namespace == "" {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, herdTimeout)
	defer cancel()
	ds, err := getter.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if log != nil {
			log.Info("cannot read the DaemonSet's size; waiting for a pull slot without it", "daemonSet", name, "err", err)
		}
		return 0
	}
	return int(max(ds.Status.DesiredNumberScheduled, 0))
}

// slotGate lets the puller see when a slot is lost.
type slotGate struct{ *slots.Gate }

func (g slotGate) Hold(ctx context.Context) (pull.Slot, error) {
	h, err := g.Gate.Hold(ctx)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// releaseGrace is how long giving back a slot may hold up a shutdown.
const releaseGrace = time.Second

// boundedRelease keeps the release of a herd-control slot from holding up
// watch's shutdown. Releasing makes API calls with timeouts of its own (it
// must work after the run's context is done), so against a hung API server
// it could take far longer than the 5 s watch has after SIGTERM. Once the
// context the slot was acquired with is done, release gets releaseGrace and
// then goes on in the background; a slot that is not cleared in time frees
// itself after the lease duration.
type boundedRelease struct {
	pull.Gate
	grace time.Duration
	log   *slog.Logger
}

func (g boundedRelease) Acquire(ctx context.Context) (func(), error) {
	release, err := g.Gate.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return g.bound(ctx, release), nil
}

// Hold is Acquire for a gate whose slots can be lost.
func (g boundedRelease) Hold(ctx context.Context) (pull.Slot, error) {
	sg, ok := g.Gate.(pull.SlotGate)
	if !ok {
		release, err := g.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return boundedSlot{release: release}, nil
	}
	s, err := sg.Hold(ctx)
	if err != nil {
		return nil, err
	}
	return boundedSlot{release: g.bound(ctx, s.Release), lost: s.Lost()}, nil
}

type boundedSlot struct {
	release func()
	lost    <-chan struct{}
}

func (s boundedSlot) Release()              { s.release() }
func (s boundedSlot) Lost() <-chan struct{} { return s.lost }

// bound returns release, limited to grace once ctx is done.
func (g boundedRelease) bound(ctx context.Context, release func()) func() {
	return func() {
		if ctx.Err() == nil {
			release()
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			release()
		}()
		t := time.NewTimer(g.grace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			g.log.Warn("releasing the pull slot is slow; not waiting for it while terminating (the slot frees itself after its lease duration)", "waited", g.grace)
		}
	}
}
