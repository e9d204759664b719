package slots

import (
	"cmp"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
)

// Waiting. A waiter lists the instance's slot Leases by label and follows
// them with one watch, so that it sends no request while nothing changes.
// docs/herd.md gives the measured reason for each rule below.
//
// Every waiter sees a freed slot at once. So that they do not all write,
// each waits a random delay and keeps reading the watch: the first write
// reaches the others before their delays end. The delay is exponential
// with a mean of window ÷ F while F slots are free, drawn again whenever F
// or the window changes. The window is pace × the nodes counted as
// waiting: Config.Herd at first, one fewer for every take seen, so that
// the first write comes about pace after a release. Two rules correct it:
//   - a lost race or a failed write (a timeout, a 5xx, a 429) doubles the
//     window, and a failed write holds the next one back, 1 s doubling to
//     30 s: an apiserver in trouble gets fewer writes;
//   - a slot seen free for stallFactor × pace while no node took any
//     halves it: fewer nodes wait than counted (some left). Not within
//     30 s of a failed call or a lost race: a slot also stays free while
//     the apiserver queues or fails writes, and halving then sends more.
//
// A held slot whose Lease stays unchanged for its duration since this
// waiter saw it change is free, by a timer. A watch the apiserver ends is
// resumed from the last version seen, as client-go's reflector does. A
// random 5-10 min after a list the waiter lists again (the slow resync),
// so that a watch that stopped delivering cannot keep it waiting for good.
const (
	// pace: about the take latency of a busy apiserver (100 ms at 1,000
	// nodes), so about one lost race per hand-over; a longer pace slows
	// every hand-over (docs/herd.md).
	pace        = 100 * time.Millisecond
	stallFactor = 16
	// unknownHerd sizes the first window when the herd is unknown.
	unknownHerd = 10
	minWindow   = 10 * time.Millisecond
	maxWindow   = 30 * time.Minute
	minRetry    = time.Second // the pauses after a failed API call
	maxRetry    = 30 * time.Second
	resync      = 5 * time.Minute
)

// absent is the version a lost race records for a slot with no Lease.
const absent = "absent"

// waiter is the state of one Hold.
type waiter struct {
	g      *Gate
	ctx    context.Context
	id     string
	names  []string
	index  map[string]int                   // slot by Lease name
	leases map[string]*coordinationv1.Lease // the latest version of each
	// since is when we first saw each Lease at its current version, on
	// our own clock (a holder is dead once its Lease stays unchanged for
	// its duration from then); freeSince when each free slot was seen
	// free, or last counted as stalled; lostAt the version of each slot
	// we lost a race on, tried again once the watch shows a newer one.
	since, freeSince map[string]time.Time
	lostAt           map[string]string
	seeded           bool
	// window is pace × left, the nodes counted as waiting, corrected.
	window time.Duration
	left   int
	// retry is the next pause after a failed API call; no write goes out
	// before quietUntil. failedAt is when a call of ours last failed or
	// lost a race, tookAt when another node last took a slot.
	retry                        time.Duration
	failedAt, quietUntil, tookAt time.Time
	// denied are the slots the API refused (Forbidden): after
	// maxConcurrentNodes was lowered, the Role loses the higher slot names
	// at once while old pods still count them. refusedSince is when the
	// API began refusing every slot, or the list.
	denied       []bool
	refusedSince time.Time
	loggedWait   bool
	// rv is the last version seen, where a watch resumes ("" after a
	// 410 Gone: list again); relistAt is when the slow resync lists.
	rv       string
	relistAt time.Time
}

func (g *Gate) newWaiter(ctx context.Context) *waiter {
	herd := cmp.Or(g.cfg.Herd, unknownHerd)
	w := &waiter{
		g: g, ctx: ctx, id: fmt.Sprintf("%s-%08x", g.cfg.Identity, mrand.Uint32()), index: map[string]int{},
		since: map[string]time.Time{}, freeSince: map[string]time.Time{}, lostAt: map[string]string{},
		seeded: g.cfg.SeedNodes == 0, window: clampWindow(time.Duration(herd) * g.pace), left: herd,
		retry: g.retry, denied: make([]bool, g.cfg.Slots),
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
			// A Role without list and watch on Leases (rendered before
			// waiting by watch) refuses for good; a restarted apiserver
			// for a moment.
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

// backOff returns the pause after a failed API call, and doubles the next.
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
	return w.watch()
}

// watch follows the slots from the last version seen until the resync.
func (w *waiter) watch() (watch.Interface, error) {
	secs := max(int64(w.relistAt.Sub(w.g.now())/time.Second), 1)
	return w.g.leases.Watch(w.ctx, metav1.ListOptions{LabelSelector: w.g.selector(), ResourceVersion: w.rv, TimeoutSeconds: &secs, AllowWatchBookmarks: true})
}

// follow waits on the watch until it holds a slot. It returns (nil, nil)
// when the watch ends and the slots should be listed again.
func (w *waiter) follow(stream watch.Interface) (*Holding, error) {
	g := w.g
	// One timer, for the drawn write (fireAt) or the next expiry or stall,
	// whichever comes first; most events change neither, and a timer per
	// event would cost every waiter of a large cluster for every renewal.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var fireAt, timerAt time.Time
	drawn := [2]time.Duration{} // the free slots and window of fireAt's draw
	for {
		now := g.now()
		free, due := w.free(now)
		switch {
		case len(free) == 0:
			fireAt = time.Time{}
			if !w.loggedWait {
				w.loggedWait = true
				g.log.Info("all pull slots are busy; waiting", "slots", w.eligible(), "seeded", w.seeded)
			}
		case fireAt.IsZero() || drawn != [2]time.Duration{time.Duration(len(free)), w.window}:
			fireAt = now.Add(w.delay(free))
			if fireAt.Before(w.quietUntil) {
				fireAt = w.quietUntil
			}
			drawn = [2]time.Duration{time.Duration(len(free)), w.window}
		}
		if !fireAt.IsZero() && (due.IsZero() || fireAt.Before(due)) {
			due = fireAt
		}
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

// apply folds one watch event into what the waiter knows. An error event
// ends the watch, and the waiter lists again.
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
	if _, slot := w.index[l.Name]; !slot {
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
	case h != "" && h != holder(prev) && h != w.id:
		w.tookAt = now // another node took the slot: one fewer waits
		if w.left > 1 {
			w.window = clampWindow(time.Duration(float64(w.window) * float64(w.left-1) / float64(w.left)))
			w.left--
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

// free lists the eligible slots that may be taken now, and says when to
// look again: the next expiry of a held slot if its holder stays silent,
// or the next stall of a free one.
func (w *waiter) free(now time.Time) (free []int, next time.Time) {
	g := w.g
	if !w.seeded && seededBy(w.leases[w.names[0]], g.cfg.SeedKey) {
		w.seeded = true
		g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
	}
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for i := range w.eligible() {
		name := w.names[i]
		l := w.leases[name]
		if v, lost := w.lostAt[name]; w.denied[i] || lost && v == version(l) {
			continue
		}
		switch h := holder(l); {
		case h == w.id:
			free = append(free, i) // a lost answer's write: taken again at once
			continue
		case h != "":
			expiry := w.since[name].Add(g.duration(l))
			if now.Before(expiry) {
				soonest(expiry)
				continue
			}
			if _, ok := w.freeSince[name]; !ok {
				w.freeSince[name] = expiry
			}
		}
		free = append(free, i)
		if at, ok := w.stallAt(name); ok {
			soonest(at)
		}
	}
	return free, next
}

func version(l *coordinationv1.Lease) string {
	if l == nil {
		return absent
	}
	return l.ResourceVersion
}

// stallAt is when a free slot counts as stalled: stallFactor × pace after it was
// seen free and after another node's last take. Slots not made yet never
// do: at the start of a new instance the whole herd lists at once, and the
// first takes come late.
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

// stall halves the window when a free slot has stalled, and counts that
// slot's wait from now; not within maxRetry of a failed call or lost race
// of ours.
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

// delay is a random wait before writing to one of the free slots.
func (w *waiter) delay(free []int) time.Duration {
	if w.mine(free) >= 0 {
		return 0
	}
	return time.Duration(mrand.ExpFloat64() * float64(w.window) / float64(len(free)))
}

// mine is the free slot whose Lease names us, from a write whose answer
// was lost; -1 if none.
func (w *waiter) mine(free []int) int {
	for _, i := range free {
		if holder(w.leases[w.names[i]]) == w.id {
			return i
		}
	}
	return -1
}

// take writes us into slot i: an update on the version the watch last
// showed, or a create if it showed none. A Lease that names us already
// comes from a write whose answer was lost: it is written again, so that
// the slot counts as held from a write this node sent, not from when it
// noticed.
func (w *waiter) take(i int) (*Holding, error) {
	g := w.g
	name, l := w.names[i], w.leases[w.names[i]]
	verb, write := "update", g.update
	switch h := holder(l); {
	case l == nil:
		// RBAC cannot limit create by name, but it limits get: the read
		// refuses a slot above a lowered maxConcurrentNodes.
		_, err := g.get(w.ctx, name)
		if err == nil { // made, and not shown yet; or never, without the slot labels (made by hand)
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

// failed handles a failed call for slot i, at version: any failure widens
// the window, a lost race marks the slot until the watch shows it change,
// API trouble holds the next write back. It returns an error only when
// waiting cannot help.
func (w *waiter) failed(verb string, i int, version string, err error) error {
	g := w.g
	switch {
	case apierrors.IsForbidden(err):
		return w.forbidden(verb, i, err)
	case apierrors.IsUnauthorized(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("%s Lease %s/%s: %w", verb, g.cfg.Namespace, w.names[i], err)
	}
	w.refusedSince, w.failedAt = time.Time{}, g.now()
	w.window = clampWindow(2 * w.window)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
		w.lostAt[w.names[i]] = version // another node wrote first
		return nil
	}
	g.log.Warn("pull slot API call failed; backing off", "verb", verb, "slot", w.names[i], "err", err)
	w.quietUntil = g.now().Add(w.backOff())
	return nil
}

// forbidden skips a slot the API refused us. The slots still named in the
// Role stay free to use; the wait ends once every eligible slot was
// refused for ForbiddenFor.
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

// refused notes that the API refused us, and ends the wait once it has
// refused for ForbiddenFor: an apiserver that has just restarted refuses
// until its RBAC caches are filled, missing RBAC for good.
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
