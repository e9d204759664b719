package slots

import (
	"container/heap"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"
)

// herd simulates nodes waiting on K slots in virtual time, with the
// waiters' aims and delays as deployed: a write reaches the other nodes
// after the propagation p, a write on a version already replaced is a
// lost race, and each holder pulls for a time drawn from 15-60 s, as the
// scale harness does. It counts what the make scale runs measure, in
// seconds of CPU instead of minutes of a loaded apiserver.
type herd struct {
	k, p      int // slots; propagation in ms
	now       time.Duration
	events    events
	version   []int // the apiserver's version and holder of each slot (-1: none)
	holder    []int
	seen      []int  // the version of each slot the waiters have seen
	seenHeld  []bool // and whether it was held
	nodes     []*simNode
	writes    int
	takes     int
	waiting   time.Duration   // summed over the waiting nodes
	freedAt   []time.Duration // when each slot was released while nodes outnumbered free slots
	handOvers []time.Duration
}

type simNode struct {
	aim     aim
	lostAt  map[int]int // the version a race was lost on
	waiting bool
}

type event struct {
	at time.Duration
	do func()
}

type events []event

func (e events) Len() int           { return len(e) }
func (e events) Less(i, j int) bool { return e[i].at < e[j].at }
func (e events) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)        { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

var epoch = time.Unix(0, 0)

func (h *herd) at(d time.Duration, do func()) { heap.Push(&h.events, event{at: h.now + d, do: do}) }

// run lets n nodes wait for the slots, all from the start, until each has pulled.
func (h *herd) run(n int) {
	h.version, h.holder, h.seen, h.seenHeld = make([]int, h.k), make([]int, h.k), make([]int, h.k), make([]bool, h.k)
	h.freedAt = make([]time.Duration, h.k)
	for i := range h.holder {
		h.holder[i] = -1
	}
	for range n {
		h.nodes = append(h.nodes, &simNode{aim: aim{slot: -1}, lostAt: map[int]int{}, waiting: true})
	}
	for i := range h.nodes {
		h.reaim(i)
	}
	for h.events.Len() > 0 {
		e := heap.Pop(&h.events).(event)
		h.waiting += time.Duration(n-h.takes) * (e.at - h.now)
		h.now = e.at
		e.do()
	}
}

// changed is a write: it reaches the waiters after the propagation.
func (h *herd) changed(slot int) {
	version, held := h.version[slot], h.holder[slot] >= 0
	h.at(time.Duration(h.p)*time.Millisecond, func() {
		h.seen[slot], h.seenHeld[slot] = version, held
		for i, n := range h.nodes {
			if n.waiting {
				h.reaim(i)
			}
		}
	})
}

// reaim updates node i's aim from what it has seen, as follow does.
func (h *herd) reaim(i int) {
	n := h.nodes[i]
	var free []int
	for s := range h.k {
		if v, lost := n.lostAt[s]; !h.seenHeld[s] && (!lost || v != h.seen[s]) {
			free = append(free, s)
		}
	}
	before := n.aim
	n.aim.update(free, epoch.Add(h.now), func(int) time.Duration { return draw(window) })
	if n.aim.slot >= 0 && (n.aim.slot != before.slot || !n.aim.at.Equal(before.at)) {
		at := n.aim.at.Sub(epoch)
		heap.Push(&h.events, event{at: at, do: func() { h.take(i, at) }})
	}
}

// take is node i's write, if its aim is still the one drawn for at.
func (h *herd) take(i int, at time.Duration) {
	n := h.nodes[i]
	if !n.waiting || n.aim.slot < 0 || n.aim.at.Sub(epoch) != at {
		return
	}
	s := n.aim.slot
	n.aim.slot = -1
	h.writes++
	if h.version[s] != h.seen[s] || h.holder[s] >= 0 {
		n.lostAt[s] = h.seen[s]
		h.reaim(i)
		return
	}
	h.takes++
	if h.freedAt[s] > 0 {
		h.handOvers = append(h.handOvers, h.now-h.freedAt[s])
		h.freedAt[s] = 0
	}
	n.waiting = false
	h.version[s]++
	h.holder[s] = i
	h.changed(s)
	h.at(15*time.Second+mrand.N(45*time.Second), func() { h.release(s) })
}

func (h *herd) release(s int) {
	h.version[s]++
	h.holder[s] = -1
	waiting, free := 0, 0
	for _, n := range h.nodes {
		if n.waiting {
			waiting++
		}
	}
	for _, x := range h.holder {
		if x < 0 {
			free++
		}
	}
	if waiting > free {
		h.freedAt[s] = h.now
	}
	h.changed(s)
}

func (h *herd) p99() time.Duration {
	slices.Sort(h.handOvers)
	if len(h.handOvers) == 0 {
		return 0
	}
	return h.handOvers[len(h.handOvers)*99/100]
}

// The herd sizes and slot counts of make scale, at the propagation seen
// on its loaded apiserver (0.4 s) and on an idle one (0.1 s): a handful
// of writes per slot taken, and a hand-over p99 within the 3 s window and
// the propagation of the release. One draw kept while any slot stayed
// free (f6da09d) had 23 writes per slot taken at K = 100 and 0.4 s, 14.5
// at K = 50. At 1 s the racers are about e^(1 s ÷ 0.375 s): 15 writes per
// slot taken, 4.7 lost races per waiting node a minute (make scale's
// 2-core machine delivered that slowly at times).
func TestHerdWritesFewPerSlotTaken(t *testing.T) {
	for _, c := range []struct{ nodes, k, p int }{
		{1000, 50, 100}, {1000, 50, 400}, {1000, 100, 400}, {1000, 10, 400}, {100, 100, 400},
	} {
		h := &herd{k: c.k, p: c.p}
		h.run(c.nodes)
		perTake, p99 := float64(h.writes)/float64(h.takes), h.p99()
		perMinute := float64(h.writes-h.takes) / h.waiting.Minutes()
		t.Logf("%d nodes, K = %d, propagation %d ms: %.2f writes per slot taken, "+
			"%.2f lost races per waiting node per minute, hand-over p99 %v of %d",
			c.nodes, c.k, c.p, perTake, perMinute, p99, len(h.handOvers))
		if limit := window + time.Duration(c.p)*time.Millisecond; h.takes != c.nodes || perTake > 4 || p99 > limit {
			t.Errorf("%d nodes, K = %d, propagation %d ms: %d of them took a slot, %.2f writes per slot taken, "+
				"hand-over p99 %v; want all, at most 4, at most %v",
				c.nodes, c.k, c.p, h.takes, perTake, p99, limit)
		}
	}
}

// A waiter aims at one free slot: anew, with a new draw, when its slot is
// no longer free; a newly freed slot takes it over with a chance of one in
// the number of free slots, with the draw kept.
func TestAimSpreadsOverFreeSlots(t *testing.T) {
	now, draws := epoch, 0
	delay := func(int) time.Duration { draws++; return time.Duration(draws) * time.Second }
	a := aim{slot: -1}
	if a.update(nil, now, delay); a.slot != -1 || draws != 0 {
		t.Fatalf("no free slot: aim %d after %d draws, want none", a.slot, draws)
	}
	if a.update([]int{3}, now, delay); a.slot != 3 || !a.at.Equal(now.Add(time.Second)) {
		t.Fatalf("one free slot: aim %d at %v, want 3 after the draw", a.slot, a.at.Sub(now))
	}
	if a.update([]int{3}, now, delay); draws != 1 {
		t.Errorf("nothing changed, yet %d draws, want 1", draws)
	}
	if a.update([]int{5}, now, delay); a.slot != 5 || draws != 2 || !a.at.Equal(now.Add(2*time.Second)) {
		t.Errorf("slot 3 taken, 5 freed: aim %d at %v after %d draws, want 5 with a new draw", a.slot, a.at.Sub(now), draws)
	}
	switched := 0
	const trials = 4000
	for range trials {
		b := aim{slot: 5, at: now, free: []int{5, 6}}
		b.update([]int{5, 6, 7}, now, delay)
		if b.slot == 7 {
			switched++
		}
		if !b.at.Equal(now) || b.slot == 6 {
			t.Fatalf("slot 7 freed: aim %d at %v, want 5 or 7 with the draw kept", b.slot, b.at.Sub(now))
		}
	}
	if share := float64(switched) / trials; share < 0.28 || share > 0.39 {
		t.Errorf("slot 7 freed beside 5 and 6: %.2f of the waiters aiming at 5 moved to it, want a third", share)
	}
}
