package slots

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The liveness defects of issue 50: a waiting node must not be kept from
// a free slot by a refusal that passes, and a take cut short must not
// leave a slot naming a holder nobody renews.

var leasesGR = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// refusals are the answers of an apiserver that has just restarted: 403
// until its RBAC caches are filled, 401 until its token caches are.
var refusals = []struct {
	name string
	err  error
}{
	{"403", apierrors.NewForbidden(leasesGR, "demo-slot-0", errors.New("RBAC: cache not filled"))},
	{"401", apierrors.NewUnauthorized("token cache not filled")},
}

// 1 and 2. One refusal of a take is not a verdict: the slot is tried again
// after a pause, while another slot stays busy. Before, a 403 skipped the
// slot for the rest of the wait, and a 401 ended the wait at once.
func TestRefusedTakeIsTriedAgain(t *testing.T) {
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			f := newFakeAPI(t)
			busy := hold(t, f.gate(t, Config{Slots: 2, Identity: "holder", LeaseDuration: time.Hour}, 0))
			free := 1 - busy.Slot()
			f.labeledSlot(t, free)
			var once sync.Once
			f.setHook(func(verb, name string, _ *coordinationv1.Lease) error {
				var err error
				if verb == "update" && name == SlotName("demo", free) {
					once.Do(func() { err = r.err })
				}
				return err
			})
			g := f.gate(t, Config{Slots: 2, LeaseDuration: time.Hour}, 0)
			h := holdWithin(t, g, 5*time.Second)
			if h.Slot() != free {
				t.Errorf("took slot %d, want %d, the free one", h.Slot(), free)
			}
		})
	}
}

// 2. A refused list is retried like a refused take, for RefusedFor.
func TestRefusedListIsRetried(t *testing.T) {
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.labeledSlot(t, 0)
			var once sync.Once
			f.setHook(func(verb, _ string, _ *coordinationv1.Lease) error {
				var err error
				if verb == "list" {
					once.Do(func() { err = r.err })
				}
				return err
			})
			holdWithin(t, f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0), 5*time.Second)
		})
	}
}

// 3. A SIGTERM while a take's write is in flight: the call is cut off
// (or answered), and the apiserver has made the write. The Lease must not
// be left naming a holder nobody renews; before, it was, for a lease
// duration.
func TestTerminatedTakeIsCleared(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cutOff bool
	}{
		{"the call cut off", true},
		{"the call answered", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.labeledSlot(t, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f.setHook(func(verb, name string, lease *coordinationv1.Lease) error {
				if verb != "update" {
					return nil
				}
				cancel() // SIGTERM while the write is in flight
				if !tc.cutOff {
					return nil // the fake makes the write and answers it
				}
				f.sneak(t, name, func(l *coordinationv1.Lease) { l.Spec = lease.Spec })
				return fmt.Errorf("client rate limiter: %w", context.Canceled)
			})
			g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour, ReleaseGrace: time.Second}, 0)
			h, err := g.Hold(ctx)
			if err == nil {
				h.Release()
				t.Fatal("Hold took a slot after its context ended")
			}
			if l := f.lease(t, SlotName("demo", 0)); holder(l) != "" {
				t.Errorf("after the wait ended, the slot names %q, a holder nobody renews; want it cleared", holder(l))
			}
		})
	}
}

// 3. A take whose answer never came, whose write lands after the node
// has taken another slot: the holding clears it. Before, it named a holder
// nobody renewed until it expired.
func TestUnansweredTakeThatLandsLaterIsCleared(t *testing.T) {
	f := newFakeAPI(t)
	f.labeledSlot(t, 0)
	f.labeledSlot(t, 1)
	var mu sync.Mutex
	var lostWrite *coordinationv1.Lease
	landed := false
	f.setHook(func(verb, name string, lease *coordinationv1.Lease) error {
		if verb != "update" {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case lostWrite == nil:
			lostWrite = lease
			return apierrors.NewServerTimeout(leasesGVR.GroupResource(), "update", 1)
		case name == lostWrite.Name && !landed:
			// It lands later; meanwhile others write the slot.
			return apierrors.NewConflict(leasesGVR.GroupResource(), name, errors.New("modified"))
		}
		return nil
	})
	g := f.gate(t, Config{Slots: 2, CallTimeout: time.Second}, 3*time.Second)
	h := hold(t, g)
	mu.Lock()
	lw := lostWrite
	mu.Unlock()
	if h.Name() == lw.Name {
		t.Fatalf("took slot %s, whose writes the test refused", h.Name())
	}
	mu.Lock()
	landed = true
	mu.Unlock()
	f.sneak(t, lw.Name, func(l *coordinationv1.Lease) { l.Spec = lw.Spec }) // it lands now
	deadline := time.Now().Add(3 * time.Second)
	for holder(f.lease(t, lw.Name)) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("slot %s still names %q, a take of this node that nobody renews, 3 s after it landed",
				lw.Name, holder(f.lease(t, lw.Name)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lost(h) {
		t.Error("the holding lost its own slot")
	}
}
