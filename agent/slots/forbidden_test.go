package slots

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// maxConcurrentNodes lowered: the Role is re-rendered at once with fewer
// slot names while old pods still know more. A slot the agent may not read
// is skipped; the wait goes on for the slots it may use.
func TestForbiddenSlotIsSkipped(t *testing.T) {
	f := newFakeAPI(t)
	// Two holders under the new K = 2 take both slots the Role still names.
	newK := f.gate(t, Config{Slots: 2, Identity: "new", LeaseDuration: time.Hour}, 0)
	a, b := hold(t, newK), hold(t, newK)
	// The old pod still counts K = 3; slot 2 is no longer in its Role.
	f.setHook(func(verb, name string, _ *coordinationv1.Lease) error {
		if name == SlotName("demo", 2) {
			gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
			return apierrors.NewForbidden(gr, name, errors.New("RBAC: not in resourceNames"))
		}
		return nil
	})
	old := f.gate(t, Config{Slots: 3, Identity: "old", LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	var h *Holding
	go func() {
		var err error
		h, err = old.Hold(ctx)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Hold ended while slots 0 and 1 were busy: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	b.Release()
	if err := <-got; err != nil {
		t.Fatalf("Hold: %v, want the slot released", err)
	}
	defer h.Release()
	if h.Slot() != b.Slot() {
		t.Errorf("took slot %d, want %d, the one released", h.Slot(), b.Slot())
	}
	a.Release()
}
