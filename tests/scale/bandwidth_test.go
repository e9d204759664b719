package scale

import (
	"context"
	"math"
	"testing"
	"time"
)

// The rates are max-min fair: equal shares of the registry, except that a
// node's transfers together never exceed its link, and what a capped
// transfer cannot use goes to the others.
func TestBandwidthRates(t *testing.T) {
	tests := []struct {
		name              string
		capacity, nodeCap int64
		nodes             []string
		want              []float64
	}{
		{"one transfer, node-capped", 1000, 200, []string{"a"}, []float64{200}},
		{"five nodes saturate", 1000, 200, []string{"a", "b", "c", "d", "e"}, []float64{200, 200, 200, 200, 200}},
		{"ten nodes share", 1000, 200, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}, []float64{100, 100, 100, 100, 100, 100, 100, 100, 100, 100}},
		{"a node's transfers share its link", 1000, 200, []string{"a", "a", "a", "a"}, []float64{50, 50, 50, 50}},
		{"capped node leaves the rest to others", 300, 100, []string{"a", "a", "b", "c"}, []float64{50, 50, 100, 100}},
		{"registry-bound: equal shares per transfer, not per node", 300, 250, []string{"a", "a", "a", "a", "b"}, []float64{60, 60, 60, 60, 60}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBandwidth(tt.capacity, tt.nodeCap)
			for _, n := range tt.nodes {
				b.flows = append(b.flows, &flow{node: n, size: 1e12, done: make(chan struct{})})
			}
			b.mu.Lock()
			b.settle()
			b.mu.Unlock()
			defer b.timer.Stop()
			for i, f := range b.flows {
				if math.Abs(f.rate-tt.want[i]) > 1e-9 {
					t.Errorf("transfer %d (node %s): rate %v, want %v", i, f.node, f.rate, tt.want[i])
				}
			}
		})
	}
}

// A completed transfer counts its size; a cancelled one the bytes sent
// before the cancel, which are fewer.
func TestBandwidthServed(t *testing.T) {
	b := NewBandwidth(1<<30, 1<<30)
	if err := b.Transfer(context.Background(), "a", 4096); err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.Served != 4096 || s.Completed != 1 {
		t.Fatalf("after one transfer: %+v, want 4096 bytes served, 1 completed", s)
	}
	slow := NewBandwidth(1000, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := slow.Transfer(ctx, "a", 1_000_000); err == nil {
		t.Fatal("a transfer of 1000 s finished within its 200 ms deadline")
	}
	s := slow.Stats()
	if s.Cancelled != 1 || s.Completed != 0 || s.Served <= 0 || s.Served >= 1_000_000 {
		t.Fatalf("after a cancelled transfer: %+v, want 1 cancelled and some but not all bytes served", s)
	}
	if s.ActiveAtSnapshot != 0 {
		t.Fatalf("%d transfers still active after the cancel", s.ActiveAtSnapshot)
	}
}

// A node's transfers in progress are its downloads, with the bytes each
// has received so far (the agent's progress watch reads them).
func TestBandwidthDownloads(t *testing.T) {
	b := NewBandwidth(1000, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Transfer(ctx, "a", 1_000_000) }()
	var first map[string]int64
	for first == nil || len(first) == 0 {
		first = b.Downloads("a")
	}
	if other := b.Downloads("b"); len(other) != 0 {
		t.Errorf("node b's downloads %v, want none", other)
	}
	for {
		now := b.Downloads("a")
		if len(now) != 1 {
			t.Fatalf("downloads %v, want one", now)
		}
		grew := false
		for id, n := range now {
			grew = n > first[id]
		}
		if grew {
			break
		}
	}
	cancel()
	<-done
	if left := b.Downloads("a"); len(left) != 0 {
		t.Errorf("downloads %v after the transfer ended, want none", left)
	}
}
