package slots_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// testRaisedK: maxConcurrentNodes went from 1 to 2, and a new pod waits
// before the re-rendered Role arrives: slot 1 is Forbidden by the real
// RBAC while slot 0 is busy. Once the Role names slot 1, the waiting pod
// takes it within seconds. Before issue 50, one refusal skipped the slot
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
	e.nameSlots(t, instance, 2) // the re-rendered Role arrives
	granted := time.Now()
	var r result
	select {
	case r = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("the new pod did not take slot 1 within 15 s of the Role naming it")
	}
	if r.err != nil {
		t.Fatalf("Hold: %v", r.err)
	}
	defer r.h.Release()
	if want := slots.SlotName(instance, 1); r.h.Name() != want {
		t.Errorf("took %s, want %s, the slot the new Role names", r.h.Name(), want)
	}
	t.Logf("slot 1 taken %s after the Role named it", time.Since(granted).Round(time.Millisecond))
}

// nameSlots updates the instance's Role (from agentToken) to name k slots.
func (e *testEnv) nameSlots(t *testing.T, instance string, k int) {
	t.Helper()
	ctx := context.Background()
	roles := e.admin.RbacV1().Roles(e.ns)
	role, err := roles.Get(ctx, "agent-"+instance, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Role: %v", err)
	}
	var names []string
	for i := range k {
		names = append(names, slots.SlotName(instance, i))
	}
	for i := range role.Rules {
		if len(role.Rules[i].ResourceNames) > 0 {
			role.Rules[i].ResourceNames = names
		}
	}
	if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update Role: %v", err)
	}
}
