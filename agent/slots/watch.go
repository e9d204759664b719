package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	mrand "math/rand/v2"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
)

// Waiting by watch. A waiter lists the instance's slot Leases once, by
// label, and then follows them with a watch, so that a waiting node sends
// no requests while nothing changes. Two costs remain, and both are
// bounded here:
//
//   - Every waiter sees a freed slot at about the same moment. If all of
//     them wrote at once, a hand-over would cost one conflicting update
//     per waiting node. So each waiter waits a random delay within its
//     own window before it writes, and reads the watch meanwhile: the
//     first writer's update reaches the others before their delays end.
//     With W waiters the first write comes about window/W after the
//     release, and a write is lost when another comes within the write's
//     own latency L of it: about W×L/window losers per hand-over. The
//     winner writes its delay into the slot (TakeDelayAnnotation), every
//     waiter sees it, and each steers its window until the winners' median
//     delay is the target: the windows settle near W × target, with about
//     L/target losers per hand-over, and no waiter needs to know W. The
//     target is targetDelay, or 2L when L is longer (see target).
//     The delay, not the time from release to take, is what is steered:
//     that time includes L, which grows with contention, and steering on
//     it would narrow the windows exactly when they are too narrow. A
//     waiter that loses a race also doubles its own window at once.
//   - The watch is ended and the list read again every Resync to 2×Resync
//     (the slow resync), so that a watch that silently stopped delivering
//     cannot keep a node waiting for good.
const (
	// DefaultResync is the shortest time between two lists of the slots
	// while waiting.
	DefaultResync = 5 * time.Minute

	// initialWindow spreads the first writes of nodes that start together,
	// as all nodes of a new DaemonSet do. A lone node does not wait it
	// out: see stallAfter.
	initialWindow = 5 * time.Second
	// stallFactor: a slot seen free stallFactor × the target delay without
	// a take means the windows are too wide for the waiters left (the
	// last nodes of a rollout, or one node alone). The window then
	// shrinks as after a late take, every target delay, and the delay is
	// drawn again, until someone takes the slot. It also cuts the long
	// tail of the winners' delays (the first of many random draws is
	// exponential): about one hand-over in eight in step waits this long.
	stallFactor = 3
	minWindow   = 20 * time.Millisecond
	maxWindow   = 2 * time.Minute
	// targetDelay is the winners' median delay the waiters steer towards:
	// short against the pulls it separates, and a few times the latency
	// of a write, which keeps losers rare.
	targetDelay = 70 * time.Millisecond

	// maxLatencySample bounds what counts as the latency of a take.
	maxLatencySample = time.Second

	minRelistBackoff = time.Second
	maxRelistBackoff = 30 * time.Second
)

// errCannotWatch means the Role lacks list or watch on Leases, as an
// older rendering did; the waiter then polls the slot names instead.
var errCannotWatch = errors.New("not allowed to list or watch the slot Leases")

// watchWaiter is the state of one Hold that waits by watch.
type watchWaiter struct {
	*waiter
	// leases is the latest version of every slot Lease, by name.
	leases map[string]*coordinationv1.Lease
	rv     string
	// since is when we first saw each Lease at its current
	// resourceVersion, on our own clock: a holder is dead once its Lease
	// stays unchanged for its duration from then.
	since map[string]time.Time
	// lostAt marks the slots we lost a race for, at the version we lost
	// on; we try them again only once the watch shows a newer one.
	lostAt map[string]string
	// freeSince is when each slot was seen free, to tell the delay of a
	// take.
	freeSince map[string]time.Time
	// outside are slots whose Lease exists without our labels (made by
	// hand, say): the list cannot see them, so they are read by name.
	outside map[int]bool
	window  time.Duration
	// latency is a moving average of the latency of others' takes.
	latency time.Duration
	// names are the slot Lease names, index maps them back to slots.
	names []string
	index map[string]int

	// size is how many slots to watch (subset.go); watched are the slots
	// the current watch follows, nil for all eligible ones; seedWatch says
	// that it was chosen while seeding, with the seed slots in it.
	size      int
	watched   map[int]bool
	seedWatch bool
	// scaledFor is the number of watched slots the window is sized for.
	scaledFor int
	// takesSeen counts others' takes since the last list; widened and
	// narrowed count those that steered the window either way.
	takesSeen, widened, narrowed int
	// herdLeft estimates how many of a known herd still wait (subset.go).
	herdLeft float64
}

func (g *Gate) holdWatching(ctx context.Context, start time.Time) (*Holding, error) {
	w := &watchWaiter{
		waiter: g.newWaiter(),
		lostAt: map[string]string{}, freeSince: map[string]time.Time{}, outside: map[int]bool{},
		index: map[string]int{},
	}
	w.size, w.window = g.firstSubset()
	w.scaledFor = w.size
	w.herdLeft = float64(g.cfg.Herd)
	for i := range g.cfg.Slots {
		w.names = append(w.names, SlotName(g.cfg.Instance, i))
		w.index[w.names[i]] = i
	}
	backoff := g.relistBackoff
	for {
		stream, err := w.list(ctx)
		if err == nil {
			var h *Holding
			started := g.now()
			h, err = w.follow(ctx, stream)
			stream.Stop()
			if h != nil {
				// The window and target say how the wait was paced.
				attrs := []any{"window", w.window.Round(time.Millisecond).String(),
					"target", w.target().Round(time.Millisecond).String(), "watching", w.watching()}
				if g.cfg.Herd > 0 {
					attrs = append(attrs, "herdLeft", int(math.Round(max(w.herdLeft, 0))))
				}
				g.logAcquired(h, start, attrs...)
			}
			if h != nil || ctx.Err() != nil {
				return h, err
			}
			if errors.Is(err, errResubset) {
				continue
			}
			lasted := g.now().Sub(started)
			if lasted > time.Minute {
				backoff = g.relistBackoff
			}
			if err == nil && lasted >= g.cfg.Resync {
				continue // the slow resync: list again at once
			}
			if err == nil {
				err = fmt.Errorf("the watch ended after %s", lasted.Round(time.Millisecond))
			}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(ctx))
		}
		switch {
		case apierrors.IsForbidden(err), apierrors.IsMethodNotSupported(err):
			return nil, fmt.Errorf("%w: %w", errCannotWatch, err)
		case apierrors.IsUnauthorized(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
			return nil, fmt.Errorf("list Leases %s/%s: %w", g.cfg.Namespace, g.selector(), err)
		}
		wait := jitter(backoff)
		g.log.Warn("listing or watching the pull slots failed; will retry", "retryIn", wait.Round(time.Millisecond).String(), "err", err)
		if !sleep(ctx, wait) {
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(ctx))
		}
		backoff = min(2*backoff, maxRelistBackoff)
	}
}

func (g *Gate) selector() string {
	return labels.SelectorFromSet(labels.Set{LabelInstance: g.cfg.Instance, LabelComponent: LabelComponentSlot}).String()
}

// list reads the instance's slots afresh and starts a watch from there.
func (w *watchWaiter) list(ctx context.Context) (watch.Interface, error) {
	g := w.g
	lctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	list, err := g.leases.List(lctx, metav1.ListOptions{LabelSelector: g.selector()})
	cancel()
	if err != nil {
		return nil, err
	}
	now := g.now()
	old := w.leases
	relist := w.since != nil
	w.leases = map[string]*coordinationv1.Lease{}
	if w.since == nil {
		w.since = map[string]time.Time{}
	}
	for i := range list.Items {
		l := &list.Items[i]
		changed := old[l.Name] == nil || old[l.Name].ResourceVersion != l.ResourceVersion
		if changed {
			w.since[l.Name] = now
			// Free since an earlier list is stale news if the slot changed
			// hands meanwhile out of our sight (it was not watched): the
			// delay we would write into it must start now.
			delete(w.freeSince, l.Name)
		}
		w.leases[l.Name] = l
		if _, seen := w.freeSince[l.Name]; holder(l) == "" && !seen {
			w.freeSince[l.Name] = now
		}
	}
	for _, name := range w.names {
		if _, seen := w.freeSince[name]; w.leases[name] == nil && !seen {
			w.freeSince[name] = now // not made yet: as good as free
		}
	}
	w.rv = list.ResourceVersion
	selector := w.chooseWatched(w.leases, now, relist)
	w.takesSeen, w.widened, w.narrowed = 0, 0, 0
	secs := int64((g.cfg.Resync + mrand.N(g.cfg.Resync+1)) / time.Second)
	return g.leases.Watch(ctx, metav1.ListOptions{
		LabelSelector: selector.String(), ResourceVersion: w.rv,
		AllowWatchBookmarks: true, TimeoutSeconds: &secs,
	})
}

// follow waits on the watch until it holds a slot. It returns (nil, nil)
// when the watch ends and the slots should be listed again.
func (w *watchWaiter) follow(ctx context.Context, stream watch.Interface) (*Holding, error) {
	g := w.g
	var fire, expire, recheck, stall, resize *time.Timer
	var fireAt, expireAt time.Time
	stopTimer := func(t **time.Timer) {
		if *t != nil {
			(*t).Stop()
			*t = nil
		}
	}
	defer stopTimer(&fire)
	defer stopTimer(&expire)
	defer stopTimer(&recheck)
	defer stopTimer(&stall)
	defer stopTimer(&resize)
	timerC := func(t *time.Timer) <-chan time.Time {
		if t == nil {
			return nil
		}
		return t.C
	}
	loggedWait := false
	for {
		now := g.now()
		if h := w.adopt(now); h != nil {
			return h, nil
		}
		free, nextExpiry := w.free(now)
		draw := w.drawWindow(free)
		switch {
		case len(free) > 0 && (fire == nil || now.Add(draw).Before(fireAt)):
			// A window that shrank meanwhile draws again: waiting out a
			// delay drawn from a wider one would idle the slot.
			stopTimer(&fire)
			d := mrand.N(draw + 1)
			fire, fireAt = time.NewTimer(d), now.Add(d)
		case len(free) == 0:
			stopTimer(&fire)
			if !loggedWait {
				loggedWait = true
				w.logWaiting()
			}
		}
		if !nextExpiry.Equal(expireAt) {
			// Most events change no expiry; a timer per event would cost
			// every waiter of a large cluster for every renewal.
			stopTimer(&expire)
			if expireAt = nextExpiry; !nextExpiry.IsZero() {
				expire = time.NewTimer(nextExpiry.Sub(now))
			}
		}
		if stall == nil && len(free) > 0 {
			stall = time.NewTimer(w.stallCheck(free, now))
		}
		if len(w.outside) > 0 && recheck == nil {
			recheck = time.NewTimer(jitter(g.cfg.PollInterval))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(ctx))
		case ev, ok := <-stream.ResultChan():
			if !ok {
				return nil, nil
			}
			if err := w.apply(ev); err != nil {
				return nil, err
			}
			if _, change := w.resubsetTo(); change && resize == nil {
				resize = time.NewTimer(w.resubsetDelay())
			}
		case <-timerC(resize):
			resize = nil
			if size, change := w.resubsetTo(); change {
				g.log.Info("watching another number of pull slots", "from", w.size, "to", size, "of", g.cfg.Slots)
				w.size = size
				return nil, errResubset
			}
		case <-timerC(expire):
			expire, expireAt = nil, time.Time{}
		case <-timerC(stall):
			stall = nil
			if free, _ := w.free(g.now()); w.stalled(free, g.now()) {
				w.window = max(w.window*10/11, minWindow)
			}
		case <-timerC(fire):
			fire = nil
			free, _ := w.free(g.now())
			if len(free) == 0 {
				continue
			}
			h, err := w.take(ctx, free[mrand.IntN(len(free))])
			if h != nil || err != nil {
				return h, err
			}
		case <-timerC(recheck):
			recheck = nil
			for _, i := range slices.Sorted(maps.Keys(w.outside)) {
				if h, err := w.try(ctx, i); h != nil || err != nil {
					return h, err
				}
			}
		}
	}
}

func (w *watchWaiter) logWaiting() {
	g := w.g
	if w.seeded {
		g.log.Info("all pull slots are busy; waiting", "slots", g.cfg.Slots, "by", "watch")
	} else {
		g.log.Info("seed nodes are pulling; waiting for one to finish", "seedNodes", g.cfg.SeedNodes, "by", "watch")
	}
}

// apply folds one watch event into the cache. An error event that is not
// "too old" ends the watch too: listing again is the cure for both.
func (w *watchWaiter) apply(ev watch.Event) error {
	g := w.g
	now := g.now()
	switch ev.Type {
	case watch.Added, watch.Modified, watch.Deleted:
		l, ok := ev.Object.(*coordinationv1.Lease)
		if !ok {
			return nil
		}
		w.rv = l.ResourceVersion
		prev := w.leases[l.Name]
		delete(w.lostAt, l.Name) // a newer version: worth another try
		if ev.Type == watch.Deleted {
			delete(w.leases, l.Name)
			delete(w.since, l.Name)
			w.freeSince[l.Name] = now
			return nil
		}
		w.leases[l.Name] = l
		w.since[l.Name] = now
		w.steer(prev, l, now)
		if i, ok := w.index[l.Name]; ok {
			delete(w.outside, i)
		}
	case watch.Bookmark:
		if l, ok := ev.Object.(*coordinationv1.Lease); ok {
			w.rv = l.ResourceVersion
		}
	case watch.Error:
		status := apierrors.FromObject(ev.Object)
		if apierrors.IsResourceExpired(status) || apierrors.IsGone(status) {
			return nil
		}
		g.log.Warn("watching the pull slots failed; listing them again", "err", status)
	}
	return nil
}

// steer follows the free/held state of a slot, and nudges the window by
// a tenth towards a winners' delay of targetDelay: narrower after a take
// that came later than that, wider after one that came sooner. Every
// waiter sees every take, so bigger steps would swing all windows at once
// and overshoot; counting only whether a take was late or early makes
// the typical (median) delay targetDelay whatever the odd draw.
func (w *watchWaiter) steer(prev, cur *coordinationv1.Lease, now time.Time) {
	name := cur.Name
	if holder(cur) == "" {
		if prev == nil || holder(prev) != "" {
			w.freeSince[name] = now
		}
		return
	}
	freed, seen := w.freeSince[name]
	delete(w.freeSince, name)
	if holder(cur) == w.id || (prev != nil && holder(prev) == holder(cur)) {
		return // ours, or a renewal
	}
	w.takesSeen++
	// Each take seen is about K/watching takes in all: that many nodes of
	// the herd are no longer waiting.
	w.herdLeft -= float64(w.g.cfg.Slots) / float64(w.watching())
	delay, err := time.ParseDuration(cur.Annotations[TakeDelayAnnotation])
	if err != nil {
		return // an older agent, or a takeover by polling
	}
	if lag := max(now.Sub(freed)-delay, 0); seen && lag <= maxLatencySample {
		// What this waiter saw of the hand-over, less the winner's delay,
		// is the latency of a take: the winner's write and the watch
		// bringing it here. It grows when the apiserver is busy. A longer
		// gap is no latency: the winner saw the slot free later than we
		// did (it listed again meanwhile, say). Counted, it raises the
		// target and with it every delay; before this bound one node of a
		// 1,000-node rollout waited 30 s on a free slot (make scale).
		w.latency = (4*w.latency + lag) / 5
	}
	switch target := w.target(); {
	case delay > target:
		w.window = max(w.window*10/11, minWindow)
		w.narrowed++
	case delay < target:
		w.window = min(w.window*11/10, maxWindow)
		w.widened++
	}
}

// target is the winners' delay to steer towards: targetDelay, or twice
// the latency of a take when that is longer. Losers come about
// latency/target per hand-over, so a busy apiserver, whose latency grows,
// gets fewer writes, not more: without this a conflict storm slowed the
// watches, which made more conflicts.
func (w *watchWaiter) target() time.Duration {
	return max(targetDelay, 2*w.latency)
}

// drawWindow is the window to draw a delay from while these slots are
// free. The window is sized for the racers of one free slot; with F free,
// the racers, each taking one, split over them, so a draw from window/F
// keeps the same pace per slot and the same few losers, and F slots go F
// times as fast. Without it, at the end of a rollout, a handful of nodes
// left with windows sized for many drew for a second or more while
// dozens of slots stood free (make scale). Slots not made yet do not
// split a window of an unknown herd: its first window spreads the whole
// herd's first writes, not one slot's.
func (w *watchWaiter) drawWindow(free []int) time.Duration {
	f := 0
	for _, i := range free {
		if w.g.cfg.Herd > 0 || w.leases[w.names[i]] != nil {
			f++
		}
	}
	return w.window / time.Duration(max(f, 1))
}

// stallAfter is how long a free slot may wait for a take before the
// windows narrow: stallFactor times the target delay.
func (w *watchWaiter) stallAfter() time.Duration { return stallFactor * w.target() }

// stalled says whether a free slot has waited longer than stallAfter.
func (w *watchWaiter) stalled(free []int, now time.Time) bool {
	for _, i := range free {
		if t, ok := w.freeSince[w.names[i]]; ok && now.Sub(t) >= w.stallAfter() {
			return true
		}
	}
	return false
}

// stallCheck is when to look again whether a free slot is stalled.
func (w *watchWaiter) stallCheck(free []int, now time.Time) time.Duration {
	if w.stalled(free, now) {
		return w.target()
	}
	next := w.stallAfter()
	for _, i := range free {
		if t, ok := w.freeSince[w.names[i]]; ok {
			next = min(next, t.Add(w.stallAfter()).Sub(now))
		}
	}
	return max(next, time.Millisecond)
}

// free lists the eligible slots that may be taken now, and says when the
// next held slot expires if its holder stays silent.
func (w *watchWaiter) free(now time.Time) (free []int, nextExpiry time.Time) {
	g := w.g
	if !w.seeded {
		if l := w.leases[w.names[0]]; l != nil && seededBy(l, g.seedValue()) {
			w.seeded = true
			w.rescale() // every watched slot is open now, not the seed slots alone
			g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
		}
	}
	for i := range w.eligible() {
		name := w.names[i]
		l := w.leases[name]
		if w.denied[i] || w.outside[i] || !w.isWatched(i) {
			continue
		}
		if l == nil {
			if w.lostAt[name] != "absent" {
				free = append(free, i)
			}
			continue
		}
		if rv, lost := w.lostAt[name]; lost && rv == l.ResourceVersion {
			continue
		}
		if holder(l) == "" {
			free = append(free, i)
			continue
		}
		expiry := w.since[name].Add(g.duration(l))
		if !now.Before(expiry) {
			free = append(free, i)
		} else if nextExpiry.IsZero() || expiry.Before(nextExpiry) {
			nextExpiry = expiry
		}
	}
	return free, nextExpiry
}

// adopt picks up a slot the watch shows we hold: a write whose answer was
// lost (a timeout, a dropped connection) may still have been made.
func (w *watchWaiter) adopt(now time.Time) *Holding {
	for i, name := range w.names {
		if l := w.leases[name]; l != nil && holder(l) == w.id {
			w.g.log.Info("a write whose answer was lost took a pull slot", "slot", l.Name)
			return w.g.newHolding(l.DeepCopy(), i, w.id, !w.seeded, now)
		}
	}
	return nil
}

// take writes us into slot i from what the watch last showed: a create if
// the Lease does not exist (after a read), else an update on its
// resourceVersion. A lost
// race returns (nil, nil) and widens the window.
func (w *watchWaiter) take(ctx context.Context, i int) (*Holding, error) {
	g := w.g
	name := w.names[i]
	now := g.now()
	seed := !w.seeded
	l := w.leases[name]
	if l == nil {
		return w.create(ctx, i)
	}
	if holder(l) != "" {
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", holder(l))
	}
	next := g.takeover(l, i, w.id, now)
	if t, ok := w.freeSince[name]; ok {
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[TakeDelayAnnotation] = max(now.Sub(t), 0).Round(time.Millisecond).String()
	}
	updated, err := g.update(ctx, next)
	if err == nil {
		return g.newHolding(updated, i, w.id, seed, now), nil
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		w.lost(name, l.ResourceVersion)
		return nil, nil
	}
	return nil, w.failed("update", i, err)
}

// create makes slot i, which the watch has not shown. It reads the slot
// by name first: RBAC cannot limit create by name, but it limits get, so
// a slot above a lowered maxConcurrentNodes is refused here instead of
// being created.
func (w *watchWaiter) create(ctx context.Context, i int) (*Holding, error) {
	g := w.g
	name := w.names[i]
	cur, err := g.get(ctx, name)
	switch {
	case err == nil:
		if cur.Labels[LabelInstance] != g.cfg.Instance || cur.Labels[LabelComponent] != LabelComponentSlot {
			// Made without our labels (by hand, say): the watch will
			// never show it, so it is read by name from now on.
			w.outside[i] = true
			return nil, nil
		}
		w.lost(name, "absent") // the watch shows it soon
		return nil, nil
	case !apierrors.IsNotFound(err):
		return nil, w.failed("get", i, err)
	}
	w.recheckSeeded(ctx, i)
	seed := !w.seeded
	now := g.now()
	created, err := g.create(ctx, g.newLease(i, w.id, now))
	switch {
	case err == nil:
		return g.newHolding(created, i, w.id, seed, now), nil
	case apierrors.IsAlreadyExists(err):
		w.lost(name, "absent")
		return nil, nil
	}
	return nil, w.failed("create", i, err)
}

// lost records a lost race on a slot at a version, and widens the window:
// losing means others write within our watch latency of us.
func (w *watchWaiter) lost(name, version string) {
	w.lostAt[name] = version
	w.window = min(2*w.window, maxWindow)
}
