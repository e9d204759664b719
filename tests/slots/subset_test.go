package slots_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// subsetWaiter is one waiter's side of the wire: how many requests it
// sent, and the label selector of its latest watch.
type subsetWaiter struct {
	calls    atomic.Int64
	mu       sync.Mutex
	selector string
}

func (w *subsetWaiter) see(r *http.Request) {
	w.calls.Add(1)
	if q := r.URL.Query(); q.Get("watch") == "true" || q.Get("watch") == "1" {
		w.mu.Lock()
		w.selector = q.Get("labelSelector")
		w.mu.Unlock()
	}
}

func (w *subsetWaiter) lastSelector() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.selector
}

// watchedSlots parses a watch's selector into the slots it follows; nil
// before the waiter has watched, or if it follows no slot subset.
func watchedSlots(t *testing.T, s, instance string) map[int]bool {
	t.Helper()
	if s == "" {
		return nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatalf("the waiter watched with selector %q, which does not parse: %v", s, err)
	}
	reqs, _ := sel.Requirements()
	var out map[int]bool
	instanceOK := false
	for _, r := range reqs {
		switch {
		case r.Key() == slots.LabelInstance:
			instanceOK = r.Operator() == selection.Equals && r.Values().Has(instance)
		case r.Key() == slots.LabelSlot && r.Operator() == selection.In:
			out = map[int]bool{}
			for v := range r.Values() {
				i, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("selector %q: slot %q is not an index", s, v)
				}
				out[i] = true
			}
		}
	}
	if !instanceOK {
		t.Fatalf("selector %q does not select instance %s", s, instance)
	}
	return out
}

type subsetTake struct {
	waiter, slot int
	// selector is the waiter's watch when it took the slot.
	selector string
}

// A waiter of a large herd (Config.Herd, as the agent reads it from its
// DaemonSet) watches only some slots, with a set-based selector on the
// slot index label. Against the real apiserver's watch cache: the selector
// is accepted, a slot changing hands wakes only the waiters that watch it
// (the others send nothing), each waiter takes only slots it watches, and
// every waiter still gets a slot.
func (e *testEnv) testSubsetWatch(t *testing.T) {
	const (
		k        = 4
		n        = 8
		herd     = 1000 // subsets start at 500 nodes
		instance = "subset"
	)
	token := e.agentToken(t, instance, k)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Holders without a herd size watch every slot: they only set up.
	held := make([]*slots.Holding, k)
	for i := range k {
		g := e.gate(t, token, instance, slots.Config{Slots: k, Identity: fmt.Sprintf("holder-%d", i), LeaseDuration: time.Hour})
		h, err := g.Hold(ctx)
		if err != nil {
			t.Fatalf("holder %d: %v", i, err)
		}
		held[h.Slot()] = h
	}
	defer func() {
		for _, h := range held {
			if h != nil {
				h.Release()
			}
		}
	}()

	waiters := make([]*subsetWaiter, n)
	takes := make(chan subsetTake, n)
	failed := make(chan error, n)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := range n {
		w := &subsetWaiter{}
		waiters[i] = w
		g := e.seenGate(t, token, instance, slots.Config{Slots: k, Identity: fmt.Sprintf("waiter-%d", i), LeaseDuration: time.Hour, Herd: herd}, w.see)
		wg.Go(func() {
			h, err := g.Hold(ctx)
			if err != nil {
				if ctx.Err() == nil {
					failed <- fmt.Errorf("waiter %d: %w", i, err)
				}
				return
			}
			takes <- subsetTake{waiter: i, slot: h.Slot(), selector: w.lastSelector()}
			h.Release()
		})
	}

	// Every waiter lists and watches; none may take a slot: all are held.
	watchers := make([][]int, k) // slot -> waiters watching it
	deadline := time.Now().Add(30 * time.Second)
	for i, w := range waiters {
		for w.lastSelector() == "" && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		sel := w.lastSelector()
		got := watchedSlots(t, sel, instance)
		if len(got) != 2 {
			t.Fatalf("waiter %d watches with %q, want a subset of 2 of the %d slots", i, sel, k)
		}
		for s := range got {
			if s < 0 || s >= k {
				t.Fatalf("waiter %d watches slot %d of %d", i, s, k)
			}
			watchers[s] = append(watchers[s], i)
		}
	}

	// A slot that some waiters watch and others do not.
	s := -1
	for i := range k {
		if c := len(watchers[i]); c > 0 && c < n && (s < 0 || c < len(watchers[s])) {
			s = i
		}
	}
	if s < 0 {
		t.Fatalf("no slot is watched by some waiters and not others: %v", watchers)
	}
	t.Logf("waiters by slot watched: %v; slot %d changes hands", watchers, s)
	var others []int
	for i := range n {
		if !slices.Contains(watchers[s], i) {
			others = append(others, i)
		}
	}
	before := make([]int64, n)
	for i, w := range waiters {
		before[i] = w.calls.Load()
	}

	// Slot s passes through each of its watchers in turn (each releases
	// at once); the others never hear of it.
	held[s].Release()
	held[s] = nil
	done := map[int]bool{}
	for range watchers[s] {
		select {
		case tk := <-takes:
			done[tk.waiter] = true
			if tk.slot != s || !slices.Contains(watchers[s], tk.waiter) {
				t.Errorf("waiter %d took slot %d; only slot %d was free, watched by waiters %v", tk.waiter, tk.slot, s, watchers[s])
			}
		case err := <-failed:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("slot %d was not taken by each of its watchers %v; took it: %v", s, watchers[s], done)
		}
	}
	time.Sleep(time.Second) // time enough for a stray event or write to show
	for _, i := range others {
		if sent := waiters[i].calls.Load() - before[i]; sent != 0 {
			t.Errorf("waiter %d, which does not watch slot %d, sent %d requests while that slot changed hands", i, s, sent)
		}
	}

	// The others get the rest of the slots, each one it watches.
	for i := range k {
		if held[i] != nil {
			held[i].Release()
			held[i] = nil
		}
	}
	for range others {
		select {
		case tk := <-takes:
			done[tk.waiter] = true
			if !watchedSlots(t, tk.selector, instance)[tk.slot] {
				t.Errorf("waiter %d took slot %d, which its watch (%q) did not follow", tk.waiter, tk.slot, tk.selector)
			}
		case err := <-failed:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("not every waiter got a slot: %d of %d did (%v)", len(done), n, done)
		}
	}
}
