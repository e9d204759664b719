package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
//     A waiter that loses a race doubles its window, and one that sees
//     hand-overs take longer than quietGap halves it. The windows thereby
//     settle near (waiting nodes) × (watch latency), which keeps about one
//     loser per hand-over, with no waiter knowing how many others there are.
//   - The watch is ended and the list read again every Resync to 2×Resync
//     (the slow resync), so that a watch that silently stopped delivering
//     cannot keep a node waiting for good.
const (
	// DefaultResync is the shortest time between two lists of the slots
	// while waiting.
	DefaultResync = 5 * time.Minute

	// initialWindow spreads the first writes of nodes that start together,
	// as all nodes of a new DaemonSet do.
	initialWindow = time.Second
	minWindow     = 20 * time.Millisecond
	maxWindow     = 2 * time.Minute
	// quietGap: when a freed slot is taken later than this after it was
	// seen free, the waiters' windows are wider than their number needs.
	quietGap = 300 * time.Millisecond

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
	// freeSince is when each slot was seen freed, to time hand-overs.
	freeSince map[string]time.Time
	// outside are slots whose Lease exists without our labels (made by
	// hand, say): the list cannot see them, so they are read by name.
	outside map[int]bool
	window  time.Duration
	// names are the slot Lease names, index maps them back to slots.
	names []string
	index map[string]int
}

func (g *Gate) holdWatching(ctx context.Context) (*Holding, error) {
	w := &watchWaiter{
		waiter: g.newWaiter(),
		window: g.firstWindow,
		lostAt: map[string]string{}, freeSince: map[string]time.Time{}, outside: map[int]bool{},
		index: map[string]int{},
	}
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
			if h != nil || ctx.Err() != nil {
				return h, err
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
	w.leases = map[string]*coordinationv1.Lease{}
	if w.since == nil {
		w.since = map[string]time.Time{}
	}
	for i := range list.Items {
		l := &list.Items[i]
		if prev := old[l.Name]; prev == nil || prev.ResourceVersion != l.ResourceVersion {
			w.since[l.Name] = now
		}
		w.leases[l.Name] = l
	}
	w.rv = list.ResourceVersion
	secs := int64((g.cfg.Resync + mrand.N(g.cfg.Resync+1)) / time.Second)
	return g.leases.Watch(ctx, metav1.ListOptions{
		LabelSelector: g.selector(), ResourceVersion: w.rv,
		AllowWatchBookmarks: true, TimeoutSeconds: &secs,
	})
}

// follow waits on the watch until it holds a slot. It returns (nil, nil)
// when the watch ends and the slots should be listed again.
func (w *watchWaiter) follow(ctx context.Context, stream watch.Interface) (*Holding, error) {
	g := w.g
	var fire, expire, recheck *time.Timer
	stopTimer := func(t **time.Timer) {
		if *t != nil {
			(*t).Stop()
			*t = nil
		}
	}
	defer stopTimer(&fire)
	defer stopTimer(&expire)
	defer stopTimer(&recheck)
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
		switch {
		case len(free) > 0 && fire == nil:
			fire = time.NewTimer(mrand.N(w.window + 1))
		case len(free) == 0:
			stopTimer(&fire)
			if !loggedWait {
				loggedWait = true
				w.logWaiting()
			}
		}
		stopTimer(&expire)
		if !nextExpiry.IsZero() {
			expire = time.NewTimer(nextExpiry.Sub(now))
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
		case <-timerC(expire):
			expire = nil
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
			return nil
		}
		w.leases[l.Name] = l
		w.since[l.Name] = now
		w.timeHandOver(prev, l, now)
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

// timeHandOver tunes the window from what this waiter sees of others'
// hand-overs: a slow one means the waiters wait longer than they need.
func (w *watchWaiter) timeHandOver(prev, cur *coordinationv1.Lease, now time.Time) {
	name := cur.Name
	switch {
	case holder(cur) == "" && (prev == nil || holder(prev) != ""):
		w.freeSince[name] = now
	case holder(cur) != "" && holder(cur) != w.id:
		if t, ok := w.freeSince[name]; ok {
			delete(w.freeSince, name)
			if now.Sub(t) > quietGap {
				w.window = max(w.window/2, minWindow)
			}
		}
	}
}

// free lists the eligible slots that may be taken now, and says when the
// next held slot expires if its holder stays silent.
func (w *watchWaiter) free(now time.Time) (free []int, nextExpiry time.Time) {
	g := w.g
	if !w.seeded {
		if l := w.leases[w.names[0]]; l != nil && seededBy(l, g.seedValue()) {
			w.seeded = true
			g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
		}
	}
	for i := range w.eligible() {
		name := w.names[i]
		l := w.leases[name]
		if w.denied[i] || w.outside[i] {
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
		// Read it by name first: RBAC cannot limit create by name, but it
		// limits get, so a slot above a lowered maxConcurrentNodes is
		// refused here instead of being created.
		h, err := w.try(ctx, i)
		if h == nil && err == nil && !w.denied[i] {
			w.lost(name, "absent")
			// It exists, or someone else created it first; if it lacks our
			// labels the watch will never show it, so it is read by name.
			w.outside[i] = true
		}
		return h, err
	}
	if holder(l) != "" {
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", holder(l))
	}
	updated, err := g.update(ctx, g.takeover(l, w.id, now))
	if err == nil {
		return g.newHolding(updated, i, w.id, seed, now), nil
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		w.lost(name, l.ResourceVersion)
		return nil, nil
	}
	return nil, w.failed("update", i, err)
}

// lost records a lost race on a slot at a version, and widens the window:
// losing means others write within our watch latency of us.
func (w *watchWaiter) lost(name, version string) {
	w.lostAt[name] = version
	w.window = min(2*w.window, maxWindow)
}
