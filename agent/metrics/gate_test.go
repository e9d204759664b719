package metrics

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

type chanGate chan struct{}

func (g chanGate) Acquire(ctx context.Context) (func(), error) {
	select {
	case <-g:
		return func() {}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestGateMeasuresWaits: slot_waiting is 1 exactly while Acquire blocks,
// and each successful acquisition is one observation of the wait.
func TestGateMeasuresWaits(t *testing.T) {
	m := New()
	inner := make(chanGate)
	g := m.Gate(inner)
	done := make(chan error)
	go func() {
		_, err := g.Acquire(context.Background())
		done <- err
	}()
	for testutil.ToFloat64(m.SlotWaiting) != 1 {
		select {
		case err := <-done:
			t.Fatalf("acquired without a slot: %v", err)
		default:
		}
	}
	inner <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(m.SlotWaiting); v != 0 {
		t.Errorf("slot_waiting %v after acquiring", v)
	}
	if n := testutil.CollectAndCount(m.SlotWait); n != 1 {
		t.Errorf("slot_wait_seconds series %d", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("err %v", err)
	}
	if v := testutil.ToFloat64(m.SlotWaiting); v != 0 {
		t.Errorf("slot_waiting %v after giving up", v)
	}
}
