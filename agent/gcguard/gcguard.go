// Package gcguard keeps the agent from fighting the kubelet's image GC.
// One removal of an image is repaired: it may be a one-off (crictl rmi,
// a wiped runtime). An image removed again after this agent pulled it
// back is one the node's GC keeps removing: downloading it again at every
// GC pass would cost its size each time, against a policy the cluster's
// admin chose. Its re-download is then held back, for 1 h, doubling at
// each further removal.
//
// A removal counts once, whoever finds it: the watcher (an event, a
// listing) or a check that finds missing an image it saw present. The
// history outlives the pod: the agent writes it into its node annotation
// (Records) and a new pod, fetch or watch, reads it back (Restore).
package gcguard

import (
	"sync"
	"time"
)

// FirstHold is how long a re-download is held back the first time.
const FirstHold = time.Hour

// Guard remembers the removals of the images of one list.
type Guard struct {
	// First is FirstHold when zero.
	First time.Duration

	mu     sync.Mutex
	images map[string]*history
}

type history struct {
	// present: seen on the node since the last removal counted, so that
	// the next one counts. repulled: pulled by this agent since then.
	present, repulled bool
	// removals counts the removals seen; holds, those that held it back.
	removals, holds int
	until           time.Time
}

// Hold is an image whose re-download is held back.
type Hold struct {
	// Removals is how many times the image was seen removed.
	Removals int
	// Until is when it may be downloaded again.
	Until time.Time
}

// Record is an image's history, as the node annotation keeps it.
type Record struct {
	Image    string
	Removals int
	Holds    int
	Until    time.Time
	// Repulled: the agent pulled it back after its last removal, so the
	// next removal holds it back. Gone: its last removal was counted, and
	// it was not seen on the node since.
	Repulled, Gone bool
}

func (g *Guard) get(name string) *history {
	if g.images == nil {
		g.images = map[string]*history{}
	}
	h := g.images[name]
	if h == nil {
		h = &history{}
		g.images[name] = h
	}
	return h
}

// Removed records that name, which the watcher saw present, left the node
// at. It returns whether the re-download is held back: the agent had
// pulled it back after an earlier removal, now or when a check found it
// missing first.
func (g *Guard) Removed(name string, at time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.get(name)
	if h.present || h.removals == 0 {
		g.count(h, at)
	}
	return at.Before(h.until)
}

// Missing is what a check that finds name missing asks before pulling it:
// whether its re-download is held back. An image seen present since its
// last removal counted was removed meanwhile, and that removal counts
// here, before the watcher may report it: the repair that follows one
// removal must not pull back the images whose removals the watcher has
// not reported yet.
func (g *Guard) Missing(name string, at time.Time) (Hold, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.images[name]
	if h == nil {
		return Hold{}, false
	}
	if h.present {
		g.count(h, at)
	}
	if !at.Before(h.until) {
		return Hold{}, false
	}
	return Hold{Removals: h.removals, Until: h.until}, true
}

// count records a removal of h at.
func (g *Guard) count(h *history, at time.Time) {
	h.removals++
	h.present = false
	if h.repulled {
		first := g.First
		if first <= 0 {
			first = FirstHold
		}
		h.until = at.Add(first << min(h.holds, 16))
		h.holds++
		h.repulled = false
	}
}

// Wiped records that name left the node in a one-off (a runtime wiped
// while down): no removal counts, and a check that finds it missing
// counts none either.
func (g *Guard) Wiped(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.get(name).present = false
}

// Seen records that name is on the node: its next removal counts.
func (g *Guard) Seen(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.get(name).present = true
}

// Pulled records that the agent pulled name: a pull after a removal makes
// the next removal a repeated one.
func (g *Guard) Pulled(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.get(name)
	h.present = true
	if h.removals > 0 {
		h.repulled = true
	}
}

// Held tells whether a re-download of name is held back at now.
func (g *Guard) Held(name string, now time.Time) (Hold, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.images[name]
	if h == nil || !now.Before(h.until) {
		return Hold{}, false
	}
	return Hold{Removals: h.removals, Until: h.until}, true
}

// HeldCount is how many images are held back at now.
func (g *Guard) HeldCount(now time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, h := range g.images {
		if now.Before(h.until) {
			n++
		}
	}
	return n
}

// Records is the history of the images ever removed, for the node
// annotation.
func (g *Guard) Records() []Record {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Record
	for name, h := range g.images {
		if h.removals == 0 {
			continue
		}
		out = append(out, Record{Image: name, Removals: h.removals, Holds: h.holds, Until: h.until,
			Repulled: h.repulled, Gone: !h.present})
	}
	return out
}

// Restore takes up the history an earlier pod recorded, for the images
// keep accepts (those of the list); what this one has seen since stays.
func (g *Guard) Restore(recs []Record, keep func(name string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range recs {
		if r.Removals <= 0 || !keep(r.Image) {
			continue
		}
		if h := g.images[r.Image]; h != nil && h.removals > 0 {
			continue
		}
		h := g.get(r.Image)
		present := h.present
		*h = history{present: !r.Gone || present, repulled: r.Repulled, removals: r.Removals, holds: r.Holds, until: r.Until}
	}
}
