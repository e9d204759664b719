package slots_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// slotGate lets the puller see a lost slot, as the agent's own adapter
// does (agent/cli).
type slotGate struct{ *slots.Gate }

func (g slotGate) Hold(ctx context.Context) (pull.Slot, error) {
	h, err := g.Gate.Hold(ctx)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// pullers tracks how many nodes have a PullImage call in flight.
type pullers struct {
	mu        sync.Mutex
	pulling   map[string]int // node -> calls in flight
	max       int
	cancelled map[string]int
	release   chan struct{}
}

func (p *pullers) nodes() int {
	n := 0
	for _, c := range p.pulling {
		if c > 0 {
			n++
		}
	}
	return n
}

// nodeRuntime is one node's runtime: every pull stalls until the test
// releases them, as a big image on a slow registry does.
type nodeRuntime struct {
	node    string
	p       *pullers
	mu      sync.Mutex
	present map[string]bool
}

func (r *nodeRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.present[ref] {
		return &cri.ImageInfo{ID: ref}, nil
	}
	return nil, nil
}

func (r *nodeRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	p := r.p
	p.mu.Lock()
	p.pulling[r.node]++
	p.max = max(p.max, p.nodes())
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.pulling[r.node]--
		p.mu.Unlock()
	}()
	select {
	case <-p.release:
		r.mu.Lock()
		r.present[ref] = true
		r.mu.Unlock()
		return ref, nil
	case <-ctx.Done():
		p.mu.Lock()
		p.cancelled[r.node]++
		p.mu.Unlock()
		return "", ctx.Err()
	}
}

type noCreds struct{}

func (noCreds) Lookup(context.Context, string) []cri.Auth { return nil }

// testOutageCap: K = 1. Node a holds the slot and pulls; node b waits. The
// apiserver goes away for longer than the lease duration, so a cannot
// renew. a stops pulling when it stops counting itself as holder (two
// thirds of the lease), before b can take the slot (a full lease after it
// last saw a renewal), so no moment has two nodes pulling, and both end
// with the image.
func (e *testEnv) testOutageCap(t *testing.T) {
	const (
		instance = "outage-cap"
		duration = 3 * time.Second
	)
	token := e.agentToken(t, instance, 1)
	p := &pullers{pulling: map[string]int{}, cancelled: map[string]int{}, release: make(chan struct{})}
	var b imagelist.Builder
	b.Add(0, "ghcr.io/team/big:1")
	list := b.List().Entries
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	results := make(chan []pull.Result, 2)
	run := func(node string) {
		g := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: node, LeaseDuration: duration})
		rt := &nodeRuntime{node: node, p: p, present: map[string]bool{}}
		pl := pull.New(rt, pull.Config{Gate: slotGate{g}, Creds: noCreds{}, OverallTimeout: 2 * time.Minute,
			Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", node)})
		go func() { results <- pl.Run(ctx, list, "") }()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if ctx.Err() != nil {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	run("a")
	waitFor("node a pulling", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.pulling["a"] > 0 })
	run("b")
	time.Sleep(time.Second) // b looks at the busy slot
	if err := e.c.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("node a to stop pulling", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.cancelled["a"] > 0 })
	time.Sleep(2 * duration) // the Lease is now expired for everyone
	if err := e.c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// Someone takes the slot again and pulls.
	waitFor("a node pulling after the outage", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.nodes() > 0 })
	time.Sleep(2 * duration) // renewals, and b or a still waiting
	close(p.release)
	for range 2 {
		for _, r := range <-results {
			if !r.Present {
				t.Errorf("%+v, want present", r)
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.max > 1 {
		t.Errorf("%d nodes pulled at once with K = 1 across the outage", p.max)
	}
	t.Logf("%s", fmt.Sprintf("cancelled pulls per node: %v; most nodes pulling at once: %d", p.cancelled, p.max))
}
