package slots_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Against the real apiserver (its RBAC, its watch cache), waiting nodes
// that watch send nothing while the only slot stays busy, and one of them
// takes it as soon as it is released. Polling waiters, for comparison,
// keep sending.
func (e *testEnv) testQuietWaiters(t *testing.T) {
	const n = 8
	for _, poll := range []bool{false, true} {
		instance := "quiet"
		if poll {
			instance = "quiet-poll"
		}
		token := e.agentToken(t, instance, 1)
		holder := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "holder", LeaseDuration: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		a, err := holder.Hold(ctx)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var calls atomic.Int64
		got := make(chan *slots.Holding, n)
		for range n {
			g := e.countedGate(t, token, instance, slots.Config{Slots: 1, Identity: "waiter", LeaseDuration: time.Hour, Poll: poll}, &calls)
			go func() {
				h, err := g.Hold(ctx)
				if err == nil {
					got <- h
				}
			}()
		}
		// Every waiter has listed and started its watch well within this.
		time.Sleep(3 * time.Second)
		before := calls.Load()
		time.Sleep(3 * time.Second)
		quiet := calls.Load() - before
		t.Logf("poll=%v: %d waiters sent %d requests in 3 s while the slot was busy", poll, n, quiet)
		if !poll && quiet != 0 {
			t.Errorf("watching waiters sent %d requests while nothing changed, want 0", quiet)
		}
		if poll && quiet < n {
			t.Errorf("polling waiters sent %d requests in 3 s, want at least one each (is the comparison still measuring polling?)", quiet)
		}
		a.Release()
		select {
		case h := <-got:
			h.Release()
		case <-ctx.Done():
			t.Fatal("no waiter took the released slot")
		}
		cancel()
	}
}

// A Role rendered before waiting by watch has no list or watch on Leases:
// a new agent under it falls back to polling and still gets the slot.
func (e *testEnv) testOldRolePolls(t *testing.T) {
	const instance = "oldrole"
	token := e.agentTokenWith(t, instance, 1, "create")
	g := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "pod", LeaseDuration: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := g.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		h, err := g.Hold(ctx)
		if err == nil {
			h.Release()
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond)
	a.Release()
	if err := <-got; err != nil {
		t.Fatalf("Hold under the old Role: %v", err)
	}
}
