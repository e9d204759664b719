package scale

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Bandwidth is the simulated registry: capacity bytes per second shared
// among the transfers in progress (processor sharing), each node's
// transfers together capped at nodeCap (its NIC). Rates are max-min fair:
// a transfer gets an equal share of the registry unless its node's cap
// holds it lower, and what it cannot use goes to the others.
type Bandwidth struct {
	capacity, nodeCap float64
	// caps, if set, are the nodes' own caps (a pull time drawn per node);
	// a node not in it has nodeCap.
	caps map[string]float64

	mu    sync.Mutex
	flows []*flow
	last  time.Time
	timer *time.Timer
	// served counts whole transfers at their size and cancelled ones at
	// the bytes sent before the cancel, rounded down.
	served    int64
	completed int
	cancelled int
	peak      int
	// peakNodes is the most nodes with a transfer in progress at once:
	// the nodes pulling, as the registry sees them.
	peakNodes int
	flowIDs   int
}

type flow struct {
	id        int
	node      string
	size      float64
	sent      float64
	rate      float64
	done      chan struct{}
	completed bool
}

// NewBandwidth returns a model with the registry's capacity and each
// node's cap, both in bytes per second.
func NewBandwidth(capacity, nodeCap int64) *Bandwidth {
	return &Bandwidth{capacity: float64(capacity), nodeCap: float64(nodeCap), last: time.Now()}
}

// Transfer moves size bytes to node and returns when they are all there,
// or with ctx's error once ctx ends (the transfer stops then, and the
// bytes sent so far count as served).
func (b *Bandwidth) Transfer(ctx context.Context, node string, size int64) error {
	f := &flow{node: node, size: float64(size), done: make(chan struct{})}
	b.mu.Lock()
	b.advance(time.Now())
	b.flowIDs++
	f.id = b.flowIDs
	b.flows = append(b.flows, f)
	b.peak = max(b.peak, len(b.flows))
	b.peakNodes = max(b.peakNodes, b.nodes())
	b.settle()
	b.mu.Unlock()
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if f.completed {
		return nil
	}
	b.advance(time.Now())
	if f.completed {
		b.settle()
		return nil
	}
	b.flows = slices.DeleteFunc(b.flows, func(g *flow) bool { return g == f })
	b.served += int64(f.sent)
	b.cancelled++
	b.settle()
	return ctx.Err()
}

// Stats are the bytes served so far and the transfers completed and
// cancelled.
type Stats struct {
	Served           int64
	Completed        int
	Cancelled        int
	PeakTransfers    int
	PeakNodes        int
	ActiveAtSnapshot int
}

// Stats returns the totals so far.
func (b *Bandwidth) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(time.Now())
	return Stats{Served: b.served, Completed: b.completed, Cancelled: b.cancelled, PeakTransfers: b.peak, PeakNodes: b.peakNodes, ActiveAtSnapshot: len(b.flows)}
}

// nodes is the number of nodes with a transfer in progress. Callers hold
// mu.
func (b *Bandwidth) nodes() int {
	seen := map[string]bool{}
	for _, f := range b.flows {
		seen[f.node] = true
	}
	return len(seen)
}

// Downloads are node's transfers in progress with the bytes each has
// received, as containerd's ingests tell the agent (pull.Progress).
func (b *Bandwidth) Downloads(node string) map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(time.Now())
	out := map[string]int64{}
	for _, f := range b.flows {
		if f.node == node {
			out[strconv.Itoa(f.id)] = int64(f.sent)
		}
	}
	return out
}

// SetNodeCap changes each node's cap, in bytes per second, between runs.
func (b *Bandwidth) SetNodeCap(nodeCap int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nodeCap = float64(nodeCap)
}

// SetNodeCaps gives the named nodes caps of their own, in bytes per
// second, between runs; nil gives every node the common cap again.
func (b *Bandwidth) SetNodeCaps(caps map[string]float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.caps = caps
}

// Reset zeroes the totals between runs; no transfer may be in progress.
func (b *Bandwidth) Reset() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.flows) > 0 {
		return fmt.Errorf("bandwidth: %d transfers still in progress", len(b.flows))
	}
	b.served, b.completed, b.cancelled, b.peak, b.peakNodes = 0, 0, 0, 0, 0
	return nil
}

// advance moves every transfer on at its rate up to now and completes
// those that are done. Callers hold mu.
func (b *Bandwidth) advance(now time.Time) {
	dt := now.Sub(b.last).Seconds()
	b.last = now
	if dt < 0 {
		dt = 0
	}
	kept := b.flows[:0]
	for _, f := range b.flows {
		f.sent = math.Min(f.size, f.sent+f.rate*dt)
		// Less than a byte left: done (float rounding would otherwise
		// leave a timer firing for a nanosecond's worth).
		if f.size-f.sent < 1 {
			f.completed = true
			b.served += int64(f.size)
			b.completed++
			close(f.done)
			continue
		}
		kept = append(kept, f)
	}
	clear(b.flows[len(kept):])
	b.flows = kept
}

// settle gives every transfer its max-min fair rate and arms the timer for
// the next completion. Callers hold mu.
func (b *Bandwidth) settle() {
	perNode := map[string]int{}
	for _, f := range b.flows {
		perNode[f.node]++
	}
	order := slices.Clone(b.flows)
	limit := func(f *flow) float64 {
		if c, ok := b.caps[f.node]; ok && c < b.nodeCap {
			return c / float64(perNode[f.node])
		}
		return b.nodeCap / float64(perNode[f.node])
	}
	slices.SortFunc(order, func(x, y *flow) int { return cmp.Compare(limit(x), limit(y)) })
	left, n := b.capacity, len(order)
	for i, f := range order {
		share := left / float64(n-i)
		f.rate = math.Min(share, limit(f))
		left -= f.rate
	}
	next := math.Inf(1)
	for _, f := range b.flows {
		if f.rate > 0 {
			next = math.Min(next, (f.size-f.sent)/f.rate)
		}
	}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if !math.IsInf(next, 1) {
		d := time.Duration(next*float64(time.Second)) + time.Microsecond
		b.timer = time.AfterFunc(d, b.tick)
	}
}

func (b *Bandwidth) tick() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(time.Now())
	b.settle()
}

// Serve answers POST /transfer?node=N&bytes=S on l: the response comes
// when the transfer is done; a client that goes away cancels it. GET
// /downloads?node=N answers Downloads as JSON. The agents' fake runtimes,
// in other processes, share the one model that way.
func (b *Bandwidth) Serve(l net.Listener) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfer", func(w http.ResponseWriter, r *http.Request) {
		size, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
		node := r.URL.Query().Get("node")
		if err != nil || size < 0 || node == "" {
			http.Error(w, "want node and bytes", http.StatusBadRequest)
			return
		}
		if err := b.Transfer(r.Context(), node, size); err != nil {
			return // the client is gone
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /downloads", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(b.Downloads(r.URL.Query().Get("node")))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("bandwidth server: %v\n", err)
		}
	}()
	return srv
}
