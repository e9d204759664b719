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
		caps              map[string]float64
		want              []float64
	}{
		{"one transfer, node-capped", 1000, 200, []string{"a"}, nil, []float64{200}},
		{"five nodes saturate", 1000, 200, []string{"a", "b", "c", "d", "e"}, nil, []float64{200, 200, 200, 200, 200}},
		{"ten nodes share", 1000, 200, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}, nil, []float64{100, 100, 100, 100, 100, 100, 100, 100, 100, 100}},
		{"a node's transfers share its link", 1000, 200, []string{"a", "a", "a", "a"}, nil, []float64{50, 50, 50, 50}},
		{"capped node leaves the rest to others", 300, 100, []string{"a", "a", "b", "c"}, nil, []float64{50, 50, 100, 100}},
		{"registry-bound: equal shares per transfer, not per node", 300, 250, []string{"a", "a", "a", "a", "b"}, nil, []float64{60, 60, 60, 60, 60}},
		{"a node's own cap (its drawn pull time), never above the common one", 1000, 200, []string{"a", "a", "b", "c"}, map[string]float64{"a": 40, "b": 500}, []float64{20, 20, 200, 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBandwidth(tt.capacity, tt.nodeCap)
			b.SetNodeCaps(tt.caps)
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

// Each node's pull time is drawn within PullSeconds, the same in every
// run, and spread over the range.
func TestPullCaps(t *testing.T) {
	o := Options{Images: []Image{{Size: 600}}, PullSeconds: [2]float64{15, 60}}
	a, b := o.pullCaps(1000), o.pullCaps(1000)
	lo, hi := math.Inf(1), 0.0
	for n, c := range a {
		secs := 600 / c
		if secs < 15 || secs > 60 || b[n] != c {
			t.Fatalf("node %s: pull %v s (again %v), want within 15-60 s and the same each time", n, secs, 600/b[n])
		}
		lo, hi = min(lo, secs), max(hi, secs)
	}
	if len(a) != 1000 || lo > 16 || hi < 59 {
		t.Errorf("%d nodes, pulls %v-%v s, want 1000 spread over 15-60 s", len(a), lo, hi)
	}
	if (Options{}).pullCaps(10) != nil {
		t.Error("caps without PullSeconds, want none")
	}
}
