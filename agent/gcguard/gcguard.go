// Package gcguard keeps the agent from fighting the kubelet's image GC.
// One removal of an image is repaired: it may be a one-off (crictl rmi,
// a wiped runtime). An image removed again after this agent pulled it
// back is one the node's GC keeps removing: downloading it again at every
// GC pass would cost its size each time, against a policy the cluster's
// admin chose. Its re-download is then held back, for 1 h, doubling at
// each further removal. The history lives in memory: an agent restart,
// which a list change is, starts afresh.
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
	// repulled: pulled again by this agent since the last removal.
	repulled bool
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

// Removed records that name left the node at. It returns true when the
// agent had pulled it back after an earlier removal: the re-download is
// held back from now on (Held).
func (g *Guard) Removed(name string, at time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.images == nil {
		g.images = map[string]*history{}
	}
	h := g.images[name]
	if h == nil {
		h = &history{}
		g.images[name] = h
	}
	h.removals++
	if h.repulled {
		first := g.First
		if first <= 0 {
			first = FirstHold
		}
		h.until = at.Add(first << min(h.holds, 16))
		h.holds++
		h.repulled = false
	}
	return at.Before(h.until)
}

// Pulled records that the agent pulled name: a pull after a removal makes
// the next removal a repeated one.
func (g *Guard) Pulled(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h := g.images[name]; h != nil {
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
