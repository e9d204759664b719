package metrics

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

type chanGate chan pull.Slot

func (g chanGate) Hold(ctx context.Context) (pull.Slot, error) {
	select {
	case s := <-g:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type testSlot struct{ lost chan struct{} }

func (testSlot) Release()                {}
func (s testSlot) Lost() <-chan struct{} { return s.lost }

// TestGateMeasuresWaits: slot_waiting is 1 exactly while Hold blocks, and
// each successful hold is one observation of the wait. The slot is the
// inner gate's own, so that its loss and its release are the same with
// metrics on (issue 26 item 5).
func TestGateMeasuresWaits(t *testing.T) {
	m := New()
	inner := make(chanGate)
	g := m.Gate(inner)
	type held struct {
		s   pull.Slot
		err error
	}
	done := make(chan held)
	go func() {
		s, err := g.Hold(context.Background())
		done <- held{s, err}
	}()
	for testutil.ToFloat64(m.SlotWaiting) != 1 {
		select {
		case h := <-done:
			t.Fatalf("held without a slot: %v", h.err)
		default:
		}
	}
	want := testSlot{lost: make(chan struct{})}
	inner <- want
	h := <-done
	if h.err != nil {
		t.Fatal(h.err)
	}
	if h.s != pull.Slot(want) {
		t.Errorf("Hold returned %#v, want the inner gate's slot %#v", h.s, want)
	}
	if v := testutil.ToFloat64(m.SlotWaiting); v != 0 {
		t.Errorf("slot_waiting %v after holding", v)
	}
	if n := testutil.CollectAndCount(m.SlotWait); n != 1 {
		t.Errorf("slot_wait_seconds series %d", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Hold(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("err %v", err)
	}
	if v := testutil.ToFloat64(m.SlotWaiting); v != 0 {
		t.Errorf("slot_waiting %v after giving up", v)
	}
}
