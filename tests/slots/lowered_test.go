package slots_test

import (
	"context"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// testLoweredK: maxConcurrentNodes went from 3 to 2. The Lease policy (as
// rendered, applied at once) allows slots 0 and 1 only, while an old pod
// still counts 3. Its write of slot 2 is Forbidden by the real admission
// policy; it skips that slot and takes slot 1 once it is free, instead of
// ending its wait with an error.
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

// testRaisedK: maxConcurrentNodes went from 1 to 2, and a new pod waits
// before the instance rendered again arrives: slot 1 is Forbidden by the
// real Lease policy while slot 0 is busy. Once the policy allows slot 1,
// the waiting pod takes it within seconds. Before issue 50, one refusal skipped the slot
// for the rest of the wait, and the pod waited for slot 0 instead.
func (e *testEnv) testRaisedK(t *testing.T) {
	const instance = "raised"
	token := e.agentToken(t, instance, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	oldPods := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "old", LeaseDuration: time.Minute})
	busy, err := oldPods.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	newPod := e.gate(t, token, instance, slots.Config{Slots: 2, Identity: "new", LeaseDuration: time.Minute})
	type result struct {
		h   *slots.Holding
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := newPod.Hold(ctx)
		got <- result{h, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("the new pod's wait ended while slot 1 was Forbidden and slot 0 busy: %v", r.err)
	case <-time.After(3 * time.Second): // slot 1 refused several times
	}
	e.render(t, instance, 2) // the instance rendered again arrives
	granted := time.Now()
	var r result
	select {
	case r = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("the new pod did not take slot 1 within 15 s of the policy allowing it")
	}
	if r.err != nil {
		t.Fatalf("Hold: %v", r.err)
	}
	defer r.h.Release()
	if want := slots.SlotName(instance, 1); r.h.Name() != want {
		t.Errorf("took %s, want %s, the slot the new policy allows", r.h.Name(), want)
	}
	t.Logf("slot 1 taken %s after the policy allowed it", time.Since(granted).Round(time.Millisecond))
}
