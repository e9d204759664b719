package slots_test

import (
	"context"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// testLoweredK: maxConcurrentNodes went from 3 to 2. The Role (the agent's
// exact RBAC, re-rendered at once) names slots 0 and 1 only, while an old
// pod still counts 3. Its read of slot 2 is Forbidden by the real RBAC; it
// skips that slot and takes slot 1 once it is free, instead of ending its
// wait with an error.
func (e *testEnv) testLoweredK(t *testing.T) {
	const instance = "lowered"
	token := e.agentToken(t, instance, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	newPods := e.gate(t, token, instance, slots.Config{Slots: 2, Identity: "new", LeaseDuration: time.Minute})
	a, err := newPods.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	b, err := newPods.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := e.gate(t, token, instance, slots.Config{Slots: 3, Identity: "old", LeaseDuration: time.Minute})
	type result struct {
		h   *slots.Holding
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := old.Hold(ctx)
		got <- result{h, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("the old pod's wait ended while both allowed slots were busy: %v", r.err)
	case <-time.After(2 * time.Second): // many looks at every slot, slot 2 included
	}
	b.Release()
	r := <-got
	if r.err != nil {
		t.Fatalf("Hold: %v, want the slot released by the new pod", r.err)
	}
	defer r.h.Release()
	if r.h.Name() != b.Name() {
		t.Errorf("took %s, want %s", r.h.Name(), b.Name())
	}
}
