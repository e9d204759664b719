package slots

import (
	"cmp"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
)

// Waiting. A waiter lists the slot Leases and follows them with one
// watch, so that it sends nothing while nothing changes. docs/herd.md
// gives the measured reason for each rule.
//
// Each event of a slot goes to every waiter watching it; at 1,000 nodes
// that fan-out made hand-overs late, so a large herd watches the slots in
// groups: slot i is in group i mod G (G the largest power of two ≤ K that
// leaves watchersPerGroup waiters to a group), and a waiter joins the
// group of a slot drawn at random. A herd of fewer than watchAllBelow
// watches all slots, and so does a waiter once the takes it saw in its
// group leave fewer than that in the herd (the groups drain alike, and
// one that empties first leaves its slots idle), or once none of its
// group's slots was free for quietFor (the others may have left).
//
// So that a freed slot's watchers do not all write, each waits a random
// delay, exponential with mean window ÷ F while F slots are free, and
// keeps reading the watch: the first write reaches the others before
// their delays end. The window is pace × the group's waiters: its share
// of Config.Herd at first, one fewer for every take seen. A lost race or
// a failed write doubles it until the next take, and a failed write holds
// the next one back, 1 s doubling to 30 s; a slot seen free for
// stallFactor × pace while no node took any halves it (not within 30 s of
// a failed call: a slot also stays free while the apiserver fails writes).
//
// A held slot whose Lease stays unchanged for its duration since it was
// seen to change is free. An ended watch is resumed from the last version
// seen, as client-go's reflector does; a waiter lists again 5-10 min
// after a list, lest a watch that stopped delivering keep it waiting.
const (
	// pace: about twice the take latency of a busy apiserver (docs/herd.md).
	pace             = 200 * time.Millisecond
	stallFactor      = 16
	unknownHerd      = 10 // sizes the first window when the herd is unknown
	watchersPerGroup = 50
	watchAllBelow    = 200
	quietFor         = 5 * time.Second
	minWindow        = 10 * time.Millisecond
	maxWindow        = 30 * time.Minute
	minRetry         = time.Second // the pauses after a failed API call
	maxRetry         = 30 * time.Second
	resync           = 5 * time.Minute
)

const absent = "absent" // the version a lost race records for a slot with no Lease

// waiter is the state of one Hold.
type waiter struct {
	g      *Gate
	ctx    context.Context
	id     string
	names  []string
	index  map[string]int                   // slot by Lease name
	leases map[string]*coordinationv1.Lease // the latest version of each
	// since: when we first saw each Lease at its version, on our clock;
	// freeSince: when each free slot was seen free, or last stalled;
	// lostAt: the version of a slot we lost a race on, skipped till it changes.
	since, freeSince map[string]time.Time
	lostAt           map[string]string
	seeded           bool
	// Its group: the slots i with i mod groups = pick mod groups (share
	// of them), and slot 0 in the watch while not seeded at the list;
	// quietSince: since when none of them was free.
	groups, pick, share int
	seedView            bool
	quietSince          time.Time
	window              time.Duration // pace × left, the nodes counted as waiting, corrected
	left                int
	// retry is the next pause after a failed API call; no write goes out
	// before quietUntil. failedAt is when a call of ours last failed (a
	// lost race is no failure), tookAt when another node last took a slot.
	retry                        time.Duration
	failedAt, quietUntil, tookAt time.Time
	// denied: the slots the API refused (a lowered maxConcurrentNodes);
	// refusedSince: since when it refuses every slot, or the list.
	denied       []bool
	refusedSince time.Time
	loggedWait   bool
	// rv: the last version seen, where a watch resumes ("" after a 410
	// Gone: list again); relistAt: when to list again.
	rv       string
	relistAt time.Time
}

func (g *Gate) newWaiter(ctx context.Context) *waiter {
	k, herd, groups := g.cfg.Slots, cmp.Or(g.cfg.Herd, unknownHerd), 1
	for herd >= watchAllBelow && 2*groups <= k && 2*groups*watchersPerGroup <= herd {
		groups *= 2
	}
	// A random slot picks the group: each gets its share of the herd.
	pick := mrand.IntN(k)
	mine := (k - pick%groups + groups - 1) / groups
	herd = max(herd*mine/k, 1)
	w := &waiter{
		g: g, ctx: ctx, id: fmt.Sprintf("%s-%08x", g.cfg.Identity, mrand.Uint32()), index: map[string]int{},
		since: map[string]time.Time{}, freeSince: map[string]time.Time{}, lostAt: map[string]string{},
		seeded: g.cfg.SeedNodes == 0, window: clampWindow(time.Duration(herd) * g.pace), left: herd,
		retry: g.retry, denied: make([]bool, g.cfg.Slots), groups: groups, pick: pick, share: mine,
	}
	for i := range g.cfg.Slots {
		w.names = append(w.names, SlotName(g.cfg.Instance, i))
		w.index[w.names[i]] = i
	}
	return w
}

func clampWindow(d time.Duration) time.Duration { return min(max(d, minWindow), maxWindow) }

// wait lists and watches the slots until it holds one.
func (w *waiter) wait() (*Holding, error) {
	g := w.g
	for {
		started := g.now()
		stream, err := w.list()
		for err == nil {
			w.refusedSince = time.Time{}
			seen := w.rv
			var h *Holding
			h, err = w.follow(stream)
			stream.Stop()
			if h != nil || err != nil {
				return h, err
			}
			if w.rv == "" || !g.now().Before(w.relistAt) {
				break // gone, or the slow resync: list again at once
			}
			if lasted := g.now().Sub(started); lasted < time.Second && w.rv == seen {
				// Not resumed in a loop: a failure, as for the reflector.
				err = fmt.Errorf("the watch ended after %s with no event", lasted.Round(time.Millisecond))
				break
			}
			w.retry, started = g.retry, g.now()
			stream, err = w.watch()
		}
		if err == nil {
			continue
		}
		if w.ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
		}
		switch {
		case apierrors.IsForbidden(err):
			// For good under an old Role; for a moment after a restart.
			if err := w.refused("list and watch Leases "+g.cfg.Namespace+" (the Role needs list and watch on leases: render the instance again)", err); err != nil {
				return nil, err
			}
		case apierrors.IsUnauthorized(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
			return nil, fmt.Errorf("list Leases %s/%s: %w", g.cfg.Namespace, g.selector(), err)
		}
		pause := w.backOff()
		g.log.Warn("listing or watching the pull slots failed; will retry", "retryIn", pause.Round(time.Millisecond).String(), "err", err)
		if !sleep(w.ctx, pause) {
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
		}
	}
}

// backOff returns the pause after a failed call, and doubles the next.
func (w *waiter) backOff() time.Duration {
	w.failedAt = w.g.now()
	d := w.retry/2 + mrand.N(w.retry/2+1)
	w.retry = min(2*w.retry, maxRetry)
	return d
}

func (g *Gate) selector() string {
	return labels.SelectorFromSet(labels.Set{LabelInstance: g.cfg.Instance, LabelComponent: LabelComponentSlot}).String()
}

// list reads the instance's slots afresh and starts a watch from there.
func (w *waiter) list() (watch.Interface, error) {
	g := w.g
	lctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	list, err := g.leases.List(lctx, metav1.ListOptions{LabelSelector: g.selector()})
	cancel()
	if err != nil {
		return nil, err
	}
	now := g.now()
	old := w.leases
	w.leases = map[string]*coordinationv1.Lease{}
	for i := range list.Items {
		l := &list.Items[i]
		if _, ok := w.index[l.Name]; !ok {
			continue // a slot above K: not ours to take
		}
		if _, ok := l.Labels[LabelSlot]; !ok {
			w.watchAll() // made by an older agent, which does not label the index
		}
		if o := old[l.Name]; o == nil || o.ResourceVersion != l.ResourceVersion {
			// Changed out of sight: its expiry and free time start now.
			w.since[l.Name] = now
			delete(w.freeSince, l.Name)
		}
		w.leases[l.Name] = l
	}
	for _, name := range w.names {
		if _, ok := w.freeSince[name]; !ok && holder(w.leases[name]) == "" {
			w.freeSince[name] = now
		}
	}
	w.rv, w.relistAt = list.ResourceVersion, now.Add(resync+mrand.N(resync+1))
	w.seedView = !w.seeded && !seededBy(w.leases[w.names[0]], g.cfg.SeedKey)
	return w.watch()
}

func (w *waiter) inGroup(i int) bool { return i%w.groups == w.pick%w.groups }

// watchAll watches every slot, counting each other group as many as its own.
func (w *waiter) watchAll() {
	k := w.g.cfg.Slots
	w.left, w.window = w.left*k/w.share, clampWindow(w.window*time.Duration(k)/time.Duration(w.share))
	w.groups, w.share = 1, k
}

// selector selects the slots the waiter watches: its group, and slot 0
// while not seeded (for SeededAnnotation).
func (w *waiter) selector() string {
	sel := w.g.selector()
	if w.groups == 1 {
		return sel
	}
	var in []string
	for i := range w.g.cfg.Slots {
		if w.inGroup(i) || i == 0 && w.seedView {
			in = append(in, strconv.Itoa(i))
		}
	}
	return sel + "," + LabelSlot + " in (" + strings.Join(in, ",") + ")"
}

// watch follows the slots from the last version seen until relistAt.
func (w *waiter) watch() (watch.Interface, error) {
	secs := max(int64(w.relistAt.Sub(w.g.now())/time.Second), 1)
	return w.g.leases.Watch(w.ctx, metav1.ListOptions{LabelSelector: w.selector(), ResourceVersion: w.rv, TimeoutSeconds: &secs, AllowWatchBookmarks: true})
}

// follow waits on the watch until it holds a slot. It returns (nil, nil)
// when the watch ends and the slots should be listed again.
func (w *waiter) follow(stream watch.Interface) (*Holding, error) {
	g := w.g
	// One timer, for the drawn write (fireAt) or the next expiry, stall or
	// quiet check: a timer per event would cost every waiter per renewal.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var fireAt, timerAt time.Time
	drawn := [2]time.Duration{} // the free slots and window of fireAt's draw
	for {
		now := g.now()
		free, due := w.free(now)
		if len(free) > 0 || w.groups == 1 || !w.seeded {
			w.quietSince = time.Time{}
		} else {
			w.quietSince = cmp.Or(w.quietSince, now)
			due = earliest(due, w.quietSince.Add(quietFor))
		}
		quiet := !w.quietSince.IsZero() && !now.Before(w.quietSince.Add(quietFor))
		if whole := w.left * g.cfg.Slots / w.share; w.groups > 1 && (whole < watchAllBelow || quiet) {
			w.watchAll()
			w.relistAt = now // list again
			return nil, nil
		}
		switch {
		case len(free) == 0:
			fireAt = time.Time{}
			if !w.loggedWait {
				w.loggedWait = true
				g.log.Info("all pull slots are busy; waiting", "slots", w.eligible(), "seeded", w.seeded)
			}
		case fireAt.IsZero() || drawn != [2]time.Duration{time.Duration(len(free)), w.window}:
			fireAt = now.Add(max(w.delay(free), w.quietUntil.Sub(now)))
			drawn = [2]time.Duration{time.Duration(len(free)), w.window}
		}
		due = earliest(due, fireAt)
		if !due.Equal(timerAt) && !due.IsZero() {
			timer.Reset(due.Sub(now))
			timerAt = due
		}
		select {
		case <-w.ctx.Done():
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
		case ev, ok := <-stream.ResultChan():
			if !ok {
				return nil, nil
			}
			w.apply(ev)
		case <-timer.C:
			timerAt = time.Time{}
			now := g.now()
			w.stall(now)
			if fireAt.IsZero() || now.Before(fireAt) {
				continue
			}
			fireAt = time.Time{}
			if free, _ := w.free(now); len(free) > 0 {
				i := w.mine(free)
				if i < 0 {
					i = free[mrand.IntN(len(free))]
				}
				if h, err := w.take(i); h != nil || err != nil {
					return h, err
				}
			}
		}
	}
}

// apply folds one watch event into what the waiter knows.
func (w *waiter) apply(ev watch.Event) {
	now := w.g.now()
	if ev.Type == watch.Error {
		if status := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(status) || apierrors.IsGone(status) {
			w.rv = "" // too old to resume from: list again
		} else {
			w.g.log.Warn("watching the pull slots failed; will retry", "err", status)
		}
		return
	}
	l, ok := ev.Object.(*coordinationv1.Lease)
	if !ok {
		return
	}
	if w.rv = l.ResourceVersion; ev.Type == watch.Bookmark {
		return
	}
	i, slot := w.index[l.Name]
	if !slot {
		return // a slot above K
	}
	prev := w.leases[l.Name]
	delete(w.lostAt, l.Name) // a newer version: worth another try
	if ev.Type == watch.Deleted {
		delete(w.leases, l.Name)
		delete(w.since, l.Name)
		w.freeSince[l.Name] = now
		return
	}
	w.leases[l.Name], w.since[l.Name] = l, now
	switch h := holder(l); {
	case h != "" && h != holder(prev) && h != w.id && w.inGroup(i):
		w.tookAt = now // another node of the group took the slot: one fewer waits
		if w.left > 1 {
			w.window = clampWindow(time.Duration(float64(w.window) * float64(w.left-1) / float64(w.left)))
			w.left--
		}
		if base := time.Duration(w.left) * w.g.pace; w.window > base { // a doubling lasts about one take
			w.window = clampWindow(max(w.window/2, base))
		}
		fallthrough
	case h != "":
		delete(w.freeSince, l.Name)
	case prev == nil || holder(prev) != "":
		w.freeSince[l.Name] = now
	}
}

// eligible is the number of slots that may be taken now.
func (w *waiter) eligible() int {
	if w.seeded {
		return w.g.cfg.Slots
	}
	return min(w.g.cfg.SeedNodes, w.g.cfg.Slots)
}

// free lists the group's eligible slots that may be taken now, and says
// when to look again: the next expiry of a held slot, or stall of a free one.
func (w *waiter) free(now time.Time) (free []int, next time.Time) {
	g := w.g
	if !w.seeded && seededBy(w.leases[w.names[0]], g.cfg.SeedKey) {
		w.seeded = true
		g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
	}
	for i := range w.eligible() {
		name := w.names[i]
		l := w.leases[name]
		if v, lost := w.lostAt[name]; !w.inGroup(i) || w.denied[i] || lost && v == version(l) {
			continue
		}
		switch h := holder(l); {
		case h == w.id:
			free = append(free, i) // a lost answer's write: taken again at once
			continue
		case h != "":
			expiry := w.since[name].Add(g.duration(l))
			if now.Before(expiry) {
				next = earliest(next, expiry)
				continue
			}
			if _, ok := w.freeSince[name]; !ok {
				w.freeSince[name] = expiry
			}
		}
		free = append(free, i)
		if at, ok := w.stallAt(name); ok {
			next = earliest(next, at)
		}
	}
	return free, next
}

// earliest is the earlier of two times; the zero time is none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

func version(l *coordinationv1.Lease) string {
	if l == nil {
		return absent
	}
	return l.ResourceVersion
}

// stallAt is when a free slot counts as stalled: stallFactor × pace after
// it was seen free and after another node's last take. Slots not made yet
// never do: the first takes of a new instance come late.
func (w *waiter) stallAt(name string) (time.Time, bool) {
	t, ok := w.freeSince[name]
	if !ok || w.leases[name] == nil {
		return time.Time{}, false
	}
	if t.Before(w.tookAt) {
		t = w.tookAt
	}
	return t.Add(stallFactor * w.g.pace), true
}

// stall halves the window when a free slot has stalled (not within
// maxRetry of a failed call), and counts its wait from now.
func (w *waiter) stall(now time.Time) {
	free, _ := w.free(now)
	stalled := false
	for _, i := range free {
		if at, ok := w.stallAt(w.names[i]); ok && !now.Before(at) {
			w.freeSince[w.names[i]], stalled = now, true
		}
	}
	if stalled && now.Sub(w.failedAt) >= maxRetry {
		w.window = clampWindow(w.window / 2)
	}
}

func (w *waiter) delay(free []int) time.Duration {
	if w.mine(free) >= 0 {
		return 0
	}
	return time.Duration(mrand.ExpFloat64() * float64(w.window) / float64(len(free)))
}

// mine is the free slot whose Lease names us (a lost answer's write), or -1.
func (w *waiter) mine(free []int) int {
	for _, i := range free {
		if holder(w.leases[w.names[i]]) == w.id {
			return i
		}
	}
	return -1
}

// take writes us into slot i: an update on the version last seen, or a
// create if none. A Lease that names us already comes from a write whose
// answer was lost: it is written again, so that the slot counts as held
// from a write this node sent, not from when it noticed.
func (w *waiter) take(i int) (*Holding, error) {
	g := w.g
	name, l := w.names[i], w.leases[w.names[i]]
	verb, write := "update", g.update
	switch h := holder(l); {
	case l == nil:
		// RBAC cannot limit create by name, but it limits get: the read
		// refuses a slot above a lowered maxConcurrentNodes.
		_, err := g.get(w.ctx, name)
		if err == nil { // made, and not shown yet (or made without the slot labels)
			err = apierrors.NewAlreadyExists(coordinationv1.Resource("leases"), name)
		}
		if !apierrors.IsNotFound(err) {
			return nil, w.failed("get", i, absent, err)
		}
		verb, write = "create", g.create
	case h == w.id:
		g.log.Info("a write whose answer was lost took this pull slot; writing it again", "slot", name)
	case h != "":
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", h)
	}
	seed, sent := !w.seeded, g.now()
	held, err := write(w.ctx, g.taken(l, i, w.id, sent))
	if err != nil {
		return nil, w.failed(verb, i, version(l), err)
	}
	return g.newHolding(w.ctx, held, i, w.id, seed, sent), nil
}

// failed handles a failed call for slot i at version: it doubles the
// window, and marks the slot (a lost race) or holds the next write back.
// It returns an error only when waiting cannot help.
func (w *waiter) failed(verb string, i int, version string, err error) error {
	g := w.g
	switch {
	case apierrors.IsForbidden(err):
		return w.forbidden(verb, i, err)
	case apierrors.IsUnauthorized(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("%s Lease %s/%s: %w", verb, g.cfg.Namespace, w.names[i], err)
	}
	w.refusedSince = time.Time{}
	w.window = clampWindow(2 * w.window)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
		w.lostAt[w.names[i]] = version // another node wrote first
		return nil
	}
	g.log.Warn("pull slot API call failed; backing off", "verb", verb, "slot", w.names[i], "err", err)
	w.quietUntil = g.now().Add(w.backOff())
	return nil
}

// forbidden skips a slot the API refused us; the wait ends once every
// eligible slot was refused for ForbiddenFor.
func (w *waiter) forbidden(verb string, i int, err error) error {
	g := w.g
	if !w.denied[i] {
		w.denied[i] = true
		g.log.Warn("not allowed to use this pull slot (was maxConcurrentNodes lowered?); skipping it", "slot", w.names[i], "verb", verb, "err", err)
	}
	for k := range w.eligible() {
		if !w.denied[k] {
			return nil
		}
	}
	if err := w.refused(verb+" every pull slot Lease in "+g.cfg.Namespace, err); err != nil {
		return err
	}
	clear(w.denied)
	w.quietUntil = g.now().Add(w.backOff())
	return nil
}

// refused ends the wait once the API has refused us for ForbiddenFor: a
// restarted apiserver refuses until its RBAC caches are filled.
func (w *waiter) refused(what string, err error) error {
	now := w.g.now()
	if w.refusedSince.IsZero() {
		w.refusedSince = now
	}
	if now.Sub(w.refusedSince) < w.g.cfg.ForbiddenFor {
		return nil
	}
	return fmt.Errorf("%s (refused for %s): %w", what, w.g.cfg.ForbiddenFor, err)
}
