package slots_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// Against the real apiserver (its field selectors, its watch cache, the
// RBAC the function renders): each waiter watches its own ticket alone,
// by name, not the slots; and every slot released is handed to one of
// them.
func (e *testEnv) testOneWatch(t *testing.T) {
	const k, n, instance = 4, 3, "onewatch"
	token := e.agentToken(t, instance, k)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var held []*slots.Holding
	for range k {
		h, err := e.gate(t, token, instance, slots.Config{Slots: k, Identity: "holder", LeaseDuration: time.Hour}).Hold(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	// The waiters' watches, by field and label selector; more than
	// enough room for a few each, so that a send never blocks a request.
	watches := make(chan string, 16*n)
	got := make(chan *slots.Holding, n)
	for range n {
		g := e.wrappedGate(t, token, instance, slots.Config{Slots: k, Identity: "waiter", LeaseDuration: time.Hour},
			func(rt http.RoundTripper, r *http.Request) (*http.Response, error) {
				if r.URL.Query().Get("watch") == "true" {
					select {
					case watches <- r.URL.Query().Get("fieldSelector") + " " + r.URL.Query().Get("labelSelector"):
					default:
					}
				}
				return rt.RoundTrip(r)
			})
		go func() {
			h, err := g.Hold(ctx)
			if err != nil {
				t.Errorf("Hold: %v", err)
				return
			}
			got <- h
		}()
	}
	for range n {
		select {
		case s := <-watches:
			if !strings.HasPrefix(s, "metadata.name="+instance+"-wait-") || !strings.HasSuffix(s, " ") {
				t.Errorf("a waiter watches %q, want its ticket alone (metadata.name=%s-wait-…), no label selector", s, instance)
			}
		case <-ctx.Done():
			t.Fatal("the waiters did not all watch")
		}
	}
	// Whichever slots are released, each waiter gets one.
	for _, h := range held[:n] {
		h.Release()
	}
	for range n {
		select {
		case h := <-got:
			defer h.Release()
		case <-ctx.Done():
			t.Fatal("released slots were not handed to the waiting nodes")
		}
	}
	for _, h := range held[n:] {
		h.Release()
	}
}
