package pull

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// lossyGate hands out slots the test can take away, and counts holds.
type lossyGate struct {
	mu    sync.Mutex
	holds int
	slots []*lossySlot
	// next is closed by the test to let the second Hold return.
	next chan struct{}
}

type lossySlot struct {
	lost     chan struct{}
	released bool
}

func (s *lossySlot) Release()              { s.released = true }
func (s *lossySlot) Lost() <-chan struct{} { return s.lost }

func (g *lossyGate) Hold(ctx context.Context) (Slot, error) {
	g.mu.Lock()
	g.holds++
	n := g.holds
	g.mu.Unlock()
	if n > 1 {
		select {
		case <-g.next:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s := &lossySlot{lost: make(chan struct{})}
	g.mu.Lock()
	g.slots = append(g.slots, s)
	g.mu.Unlock()
	return s, nil
}

// stallingRuntime blocks every pull until it is released or cancelled,
// and records which calls were cancelled.
type stallingRuntime struct {
	mu        sync.Mutex
	started   chan string
	release   chan struct{}
	cancelled int
	present   map[string]bool
}

func (m *stallingRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.present[ref] {
		return &cri.ImageInfo{ID: ref}, nil
	}
	return nil, nil
}

func (m *stallingRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	m.started <- ref
	select {
	case <-m.release:
		m.mu.Lock()
		m.present[ref] = true
		m.mu.Unlock()
		return ref, nil
	case <-ctx.Done():
		m.mu.Lock()
		m.cancelled++
		m.mu.Unlock()
		return "", ctx.Err()
	}
}

// A node that loses its herd-control slot (it could not renew the Lease,
// as in an API outage) stops pulling at once: the calls in flight are
// cancelled and none start until it holds a slot again. Once another node
// may take the slot, this one is no longer pulling, so the cap holds.
func TestLostSlotStopsPullingUntilASlotIsHeldAgain(t *testing.T) {
	rt := &stallingRuntime{started: make(chan string, 10), release: make(chan struct{}), present: map[string]bool{}}
	g := &lossyGate{next: make(chan struct{})}
	p := New(rt, Config{Parallelism: 2, Gate: g, Creds: noCreds{}, Log: discard, OverallTimeout: guard})
	done := make(chan []Result, 1)
	go func() { done <- p.Run(context.Background(), entries("a:1", "b:1", "c:1"), "") }()
	<-rt.started
	<-rt.started
	g.mu.Lock()
	first := g.slots[0]
	g.mu.Unlock()
	close(first.lost)
	// Both calls in flight are cancelled; no call starts while no slot is held.
	deadline := time.Now().Add(30 * time.Second)
	for {
		rt.mu.Lock()
		c := rt.cancelled
		rt.mu.Unlock()
		if c == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls cancelled after the slot was lost, want 2", c)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case ref := <-rt.started:
		t.Fatalf("a pull of %s started without a slot", ref)
	case <-time.After(100 * time.Millisecond):
	}
	g.mu.Lock()
	holds := g.holds
	g.mu.Unlock()
	if !first.released || holds != 2 {
		t.Errorf("lost slot released %v, holds %d; want the lost slot released and a second Hold", first.released, holds)
	}
	close(g.next)
	close(rt.release)
	for _, r := range <-done {
		// The cut-short attempts are not the images' failures.
		if !r.Present || r.Attempts != 1 {
			t.Errorf("%+v, want present after 1 attempt", r)
		}
	}
}
