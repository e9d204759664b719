package slots_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Against the real apiserver (its RBAC, its watch cache), waiting nodes
// send nothing while the only slot stays busy (the head of the queue
// looks every 5 s, after this window), and one of them takes it as soon
// as it is released.
func (e *testEnv) testQuietWaiters(t *testing.T) {
	const n, instance = 8, "quiet"
	token := e.agentToken(t, instance, 1)
	holder := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "holder", LeaseDuration: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := holder.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	got := make(chan *slots.Holding, n)
	for range n {
		g := e.countedGate(t, token, instance, slots.Config{Slots: 1, Identity: "waiter", LeaseDuration: time.Hour}, &calls)
		go func() {
			h, err := g.Hold(ctx)
			if err == nil {
				got <- h
			}
		}()
	}
	// Every waiter writes its ticket, lists the slots and the tickets, and
	// watches its ticket: four requests each.
	for calls.Load() < 4*n {
		time.Sleep(10 * time.Millisecond)
	}
	before := calls.Load()
	time.Sleep(3 * time.Second)
	quiet := calls.Load() - before
	t.Logf("%d waiters sent %d requests in 3 s while the slot was busy", n, quiet)
	if quiet != 0 {
		t.Errorf("waiting nodes sent %d requests while nothing changed, want 0", quiet)
	}
	a.Release()
	select {
	case h := <-got:
		h.Release()
	case <-ctx.Done():
		t.Fatal("no waiter took the released slot")
	}
}

// A Role rendered before waiting by watch has no list or watch on Leases.
// With the real RBAC, the wait ends with an error that says what to do,
// once the refusal has lasted RefusedFor (a restarted apiserver refuses
// for a moment too).
func (e *testEnv) testOldRole(t *testing.T) {
	const instance = "oldrole"
	token := e.agentTokenWith(t, instance, 1, "create")
	g := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "pod", LeaseDuration: time.Hour, RefusedFor: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := g.Hold(ctx)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "render the instance again") {
		t.Fatalf("Hold under the old Role: %v, want the refusal and what to do", err)
	}
}
