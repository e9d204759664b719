package slots

import (
	"errors"
	"maps"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Watching some of the slots. Every event of a watched slot goes to every
// waiter that watches it: with W waiters on all K slots, each hand-over
// costs the apiserver about 2W sends and the waiters 2W decodes. At 1,000
// nodes that fan-out, not the requests, is what made hand-overs late
// (make scale). So a waiter of a large herd follows only some of the
// slots, enough that each keeps about watchersPerSlot watchers, with one
// set-based selector on LabelSlot.
//
// The herd's size, when the agent could read it (Config.Herd), gives the
// first subset, and the takes a waiter sees tell how much of the herd is
// left. Otherwise a waiter cannot count the others, but its steered window
// tells it: the window settles where the first of the n waiters' uniform
// draws comes at the target delay, about n × target / ln 2. From either
// estimate a waiter sizes its subset, and relists with another when it
// leaves [watchersPerSlot/4, 4 × watchersPerSlot]: one waiter's window
// wanders by a factor of two or so around the others' (a lost race
// doubles it), and a band half as wide had a herd of 1,000 relisting
// several times a second for nothing. A herd that shrinks (the end of a
// rollout) thus widens its subsets until every waiter watches all slots
// again, as a small cluster does from the start.
//
// Herds of fewer than watchAllBelow nodes watch every slot: there the
// fan-out costs little (hand-overs at 300 nodes were as fast by one watch
// of all slots as at 100), and subsets only thin out at the end.
//
// A slot nobody watches would idle. Three things keep that rare and
// short: subsets hold at least minSubset slots, drawn afresh at every
// list, so that the waiters of a slot leave it by taking any of theirs
// and stay spread evenly; every relist adds the slots it shows free, and
// those it shows unchanged for their lease duration since an earlier list
// (holders renew more often), whose holders may have died (the slow
// resync lists every 5-10 min, so with W waiters one lists every few
// seconds); and a first list whose subset has no free slot adds one that
// is free, so that a node joining a quiet cluster does not wait on two
// busy slots while others are free.
const (
	watchersPerSlot = 20
	watchAllBelow   = 500
	minSubset       = 2
	// settleTakes is how many takes a waiter sees after a list before it
	// judges its subset: the window moves a tenth per take.
	settleTakes = 10
	// A waiter that wants another subset lists again after a random
	// delay within its window, at least minResubsetSpread and at most
	// defaultResubsetSpread: a herd's waiters decide at the same take, and
	// at 1,000 nodes their lists within 5 s slowed every hand-over then.
	// The window is wide in a large herd and narrow in a small one, which
	// must widen its subsets soon.
	minResubsetSpread     = time.Second
	defaultResubsetSpread = 10 * time.Second
)

// firstSubset is a new waiter's subset size and window. Knowing the herd,
// it watches as many slots as leave watchersPerSlot watchers on each
// were the whole herd waiting (a new DaemonSet, a new list), with the
// window that many steer to. Not knowing it, it watches all slots, and
// its window grows from firstWindow.
func (g *Gate) firstSubset() (size int, window time.Duration) {
	k := g.cfg.Slots
	if g.cfg.Herd == 0 {
		return k, g.firstWindow
	}
	if g.cfg.Herd < watchAllBelow {
		return k, g.window(float64(g.cfg.Herd))
	}
	size = min(max((k*watchersPerSlot+g.cfg.Herd-1)/g.cfg.Herd, min(minSubset, k)), k)
	return size, g.window(float64(g.cfg.Herd) * float64(size) / float64(k))
}

// window is the window that perSlot waiters of a slot steer to.
func (g *Gate) window(perSlot float64) time.Duration {
	window := time.Duration(perSlot * float64(targetDelay) / math.Ln2)
	return min(max(window, minWindow), maxWindow)
}

// errResubset ends a watch to list again and watch another subset.
var errResubset = errors.New("watching another subset of the slots")

// watching is how many slots the current watch follows.
func (w *watchWaiter) watching() int {
	if w.watched == nil {
		return w.eligible()
	}
	return len(w.watched)
}

// isWatched says whether the current watch follows slot i.
func (w *watchWaiter) isWatched(i int) bool {
	return w.watched == nil || w.watched[i]
}

// chooseWatched picks the slots the next watch follows, from the Leases
// listed at now, and returns the watch's selector. It picks all slots
// when the subset would be all of them, and when a slot Lease lacks
// LabelSlot (made by an older agent; its next take adds it). While
// seeding, the subset has the seed slots too, which are all a waiter may
// take then: when seeding ends, the whole herd races for the other
// slots, and with a watch of all slots each of those takes went to every
// waiter (and the waiters listed again for their subsets at the same
// time); the seed slots go at the next list. A relist (not the first
// list of this wait) adds the slots that may lack watchers: at the
// first, every slot of a new rollout is free or not yet made, and adding
// them had a herd of 1,000 watch all slots until it listed again.
func (w *watchWaiter) chooseWatched(listed map[string]*coordinationv1.Lease, now time.Time, relist bool) labels.Selector {
	defer w.rescale()
	base := labels.SelectorFromSet(labels.Set{LabelInstance: w.g.cfg.Instance, LabelComponent: LabelComponentSlot})
	n := w.eligible()
	w.watched, w.seedWatch = nil, !w.seeded
	if w.size >= w.g.cfg.Slots {
		return base
	}
	for _, l := range listed {
		if _, ok := l.Labels[LabelSlot]; !ok {
			return base
		}
	}
	watched := map[int]bool{}
	for _, i := range mrand.Perm(w.g.cfg.Slots) {
		if len(watched) == w.size {
			break
		}
		if !w.denied[i] {
			watched[i] = true
		}
	}
	for i := range n {
		if !w.seeded && !w.denied[i] {
			watched[i] = true // a seed slot
		}
	}
	free := func(i int) bool {
		l := listed[w.names[i]]
		return !w.denied[i] && (l == nil || holder(l) == "")
	}
	for i := range n {
		l := listed[w.names[i]]
		switch {
		case !relist:
		case free(i):
			watched[i] = true // maybe nobody else watches it
		case l != nil && !w.denied[i] && !now.Before(w.since[l.Name].Add(w.g.duration(l))):
			watched[i] = true // unchanged for its duration since an earlier list: its holder may be dead
		}
	}
	hasFree := false
	for i := range watched {
		hasFree = hasFree || free(i)
	}
	if !relist && !hasFree {
		var frees []int
		for i := range n {
			if free(i) {
				frees = append(frees, i)
			}
		}
		if len(frees) > 0 {
			watched[frees[mrand.IntN(len(frees))]] = true
		}
	}
	if len(watched) >= w.g.cfg.Slots {
		return base
	}
	w.watched = watched
	var values []string
	for _, i := range slices.Sorted(maps.Keys(watched)) {
		values = append(values, strconv.Itoa(i))
	}
	req, err := labels.NewRequirement(LabelSlot, selection.In, values)
	if err != nil { // the values are small integers: cannot happen
		w.watched = nil
		return base
	}
	return base.Add(*req)
}

// resubsetDelay is how long to wait before listing for another subset.
func (w *watchWaiter) resubsetDelay() time.Duration {
	spread := min(max(w.window, minResubsetSpread), w.g.resubsetSpread)
	return mrand.N(spread + 1)
}

// rescale keeps the window in step with a new subset: the watchers per
// slot, and with them the window the steering would settle at, scale with
// the number of slots each waiter watches. The window is scaled from the
// subset it was made for, which for the first list is firstSubset's:
// scaling from all slots there had a herd of 1,000 start with windows a
// 25th of their size, and lose 30 racers per hand-over in its first burst
// (make scale). While seeding, the seed slots are all there is and the
// window stays; when seeding ends, every watched slot opens, and the
// window scales to them (free calls rescale).
func (w *watchWaiter) rescale() {
	if !w.seeded {
		return
	}
	after := w.watching()
	if w.scaledFor > 0 && after != w.scaledFor {
		w.window = min(max(time.Duration(int64(w.window)*int64(after)/int64(w.scaledFor)), minWindow), maxWindow)
	}
	w.scaledFor = after
}

// resubsetTo says whether to list again to watch another subset, and of
// what size: once seeding has ended under a watch chosen while seeding
// (to drop the seed slots, or to leave a watch of all slots), and when
// the estimate of watchers per slot asks for another size.
func (w *watchWaiter) resubsetTo() (int, bool) {
	if !w.seeded {
		return 0, false
	}
	if w.seedWatch && w.size < w.eligible() {
		return w.size, true
	}
	size := w.wantSize()
	return size, size != w.size
}

// wantSize is the subset size that keeps about watchersPerSlot watchers on
// each slot; the current one while the estimate stays within a factor of
// four of that. With a known herd, the estimate counts takes: each one
// seen on a watched slot is about K ÷ (slots watched) takes in all, that
// many nodes fewer waiting. (The window, below, lags a draining herd: at
// 1,000 nodes and K = 50 a waiter of two slots sees a take every 2.5 s,
// and the last 200 nodes found their subsets thin for seconds.) Without
// the herd, the window tells, once settleTakes takes were seen and it has
// found its level (takes steered it both ways: a first window of 5 s
// grows for a few seconds before it says how many wait).
func (w *watchWaiter) wantSize() int {
	n := w.eligible()
	if !w.seeded {
		return w.size
	}
	var perSlot float64
	low := float64(watchersPerSlot) / 4
	switch {
	case w.g.cfg.Herd > 0:
		perSlot = max(w.herdLeft, 0) * float64(w.watching()) / float64(w.g.cfg.Slots)
		// The count drifts smoothly, so it may widen sooner than the
		// window: with 5 watchers left on a slot, one slot in 150 has
		// none, and at 1,000 nodes some idled for seconds until a waiter
		// listed again.
		low = watchersPerSlot / 2
	case w.takesSeen < settleTakes || w.widened == 0 || w.narrowed == 0:
		return w.size
	default:
		perSlot = math.Ln2 * float64(w.window) / float64(w.target())
	}
	if perSlot >= low && perSlot <= 4*watchersPerSlot || w.watched == nil && perSlot < watchAllBelow {
		return w.size
	}
	if perSlot <= 0 {
		return n // the herd is gone, by the count: the last waiters watch all
	}
	want := int(math.Min(math.Ceil(float64(w.watching())*watchersPerSlot/perSlot), float64(n)))
	return max(want, min(minSubset, n))
}
