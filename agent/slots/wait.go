package slots

import (
	"cmp"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// Waiting. A waiter lists the instance's slot Leases and follows them
// with one label-selected watch, so that it sends nothing while nothing
// changes. It aims at one free (or expired) slot at random and writes it
// after a random delay within the window (a few seconds, whatever the
// herd size), reading the watch meanwhile: the first write for a slot
// reaches the others aiming at it before their delays end, so that most
// of them never write (aim). The delay is the window less an exponential
// draw of mean window/8, not below 0: the density of the draws rises
// towards the window's end, so that the shortest of n draws lies near
// window - ln(n) × window/8 and the draws within a propagation time p of
// it number about e^(p ÷ window/8), whatever n (up to e^8, about 3,000
// waiting nodes): 3 at p = 0.4 s. This is the timer of multicast
// feedback suppression (Nonnenmacher and Biersack, 1998). Drawn uniformly
// the writers grew with the herd (67 per slot taken at 1,000 nodes).
//
// A take's write is read in the watch too (send): a write whose answer
// is lost holds the slot as soon as the watch shows it. A lost race (a
// conflict) skips that version of the slot; a failed write backs off, 1 s
// doubling to 30 s. An ended watch is resumed from the last version seen,
// as client-go's reflector does; a 410 Gone or a watch that ends at once
// with nothing in it lists again, never sooner than a second after the
// last list. Each watch asks the apiserver to end it after 5-10 min, lest
// one that stopped delivering keep the waiter waiting.
const (
	window     = 3 * time.Second // the random delay before a take is drawn within it
	minRetry   = time.Second     // the pauses after a failed API call
	maxRetry   = 30 * time.Second
	listPeriod = time.Second // at most one list a second
	resync     = 5 * time.Minute
)

// waiter is the state of one Hold.
type waiter struct {
	g   *Gate
	ctx context.Context
	// id is our holder in the last take, new for every take.
	id string
	// unsure are the takes whose answer never came: a Lease naming one
	// of them is ours (free, take), and one we do not go on to hold is
	// cleared (Holding.disownUnsure, Gate.Hold).
	unsure []take
	names  []string
	// By slot: free looks at every slot at every event, which by name
	// took 9 µs at K = 100, 3.6 times the event's decoding (3.3 µs by
	// slot; BenchmarkWaiterEvent).
	// leases: the latest version of each Lease.
	leases []*coordinationv1.Lease
	// since: when we first saw that version, on our clock.
	since []time.Time
	// lostAt: the version we lost a race on, skipped till it changes.
	lostAt []*coordinationv1.Lease
	seeded bool
	// retry is the next pause after a failed API call; no write goes out
	// before quietUntil.
	retry      time.Duration
	quietUntil time.Time
	// deniedUntil: when a slot the API refused (a lowered
	// maxConcurrentNodes, or a restarting apiserver) is tried again;
	// deniedPause: the pause after its next refusal, doubling.
	deniedUntil []time.Time
	deniedPause []time.Duration
	// refusedSince: since when the API refuses every slot, or the list.
	refusedSince time.Time
	loggedWait   bool
	// rv is the last version seen, where a watch resumes ("" after a 410
	// Gone: list again).
	rv string
	// listedAt is when the last list was sent.
	listedAt time.Time
	aim      aim
}

// take is a take's write whose answer never came: the holder it named,
// the slot, and when it was sent.
type take struct {
	id   string
	slot int
	sent time.Time
}

func (g *Gate) newWaiter(ctx context.Context) *waiter {
	k := g.cfg.Slots
	w := &waiter{
		g:           g,
		ctx:         ctx,
		seeded:      g.cfg.SeedNodes == 0,
		retry:       g.retry,
		aim:         aim{slot: -1},
		leases:      make([]*coordinationv1.Lease, k),
		lostAt:      make([]*coordinationv1.Lease, k),
		since:       make([]time.Time, k),
		deniedUntil: make([]time.Time, k),
		deniedPause: make([]time.Duration, k),
	}
	for i := range k {
		w.names = append(w.names, SlotName(g.cfg.Instance, i))
	}
	return w
}

// wait lists and watches the slots until it holds one.
func (w *waiter) wait() (*Holding, error) {
	g := w.g
	// pause follows a failure; and lists come at most once a second.
	var pause time.Duration
	for {
		if !sleep(w.ctx, max(pause, w.listedAt.Add(listPeriod).Sub(g.now()))) {
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
		}
		pause = 0
		h, err := w.listAndFollow()
		if h != nil {
			return h, nil
		}
		if err == nil || w.ctx.Err() != nil {
			continue
		}
		if permanent(err) {
			return nil, fmt.Errorf("list Leases %s/%s: %w", g.cfg.Namespace, g.selector, err)
		}
		if kube.Refused(err) {
			// For good under an old Role; for a moment after a restart.
			what := "list and watch Leases " + g.cfg.Namespace +
				" (the Role needs list and watch on leases: render the instance again)"
			if err := w.refused(what, err); err != nil {
				return nil, err
			}
		}
		pause = w.backOff()
		g.log.Warn("listing or watching the pull slots failed; will retry",
			"retryIn", pause.Round(time.Millisecond).String(), "err", err)
	}
}

// listAndFollow lists the slots and follows them, resuming ended watches,
// until it holds a slot, a call fails, or the slots should be listed
// again (nil, nil).
func (w *waiter) listAndFollow() (*Holding, error) {
	g := w.g
	stream, err := w.list()
	for err == nil {
		w.refusedSince = time.Time{}
		w.retry = g.retry
		started := g.now()
		seen := w.rv
		var h *Holding
		h, err = w.follow(stream)
		stream.Stop()
		if h != nil || err != nil {
			return h, err
		}
		if w.rv == "" {
			return nil, nil // gone: list again
		}
		if g.now().Sub(started) < time.Second && w.rv == seen {
			return nil, nil // ended at once with nothing in it: list again
		}
		stream, err = w.watch()
	}
	return nil, err
}

// permanent errors end the wait: waiting cannot help. A refusal (403,
// 401) is not one of them: it is retried for Config.RefusedFor.
func permanent(err error) bool {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
		return true
	}
	return false
}

// backOff returns the pause after a failed call, and doubles the next.
func (w *waiter) backOff() time.Duration {
	d := w.retry/2 + mrand.N(w.retry/2+1)
	w.retry = min(2*w.retry, maxRetry)
	return d
}

// list reads the instance's slots afresh and starts a watch from there.
func (w *waiter) list() (watch.Interface, error) {
	g := w.g
	w.listedAt = g.now()
	lctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	opts := metav1.ListOptions{LabelSelector: g.selector}
	list, err := g.cfg.Client.List(lctx, opts)
	cancel()
	if err != nil {
		return nil, err
	}
	now := g.now()
	old := w.leases
	w.leases = make([]*coordinationv1.Lease, len(w.names))
	for j := range list.Items {
		l := &list.Items[j]
		i := slices.Index(w.names, l.Name)
		if i < 0 {
			continue // a slot above K, or named otherwise: not ours to take
		}
		if old[i] == nil || old[i].ResourceVersion != l.ResourceVersion {
			w.since[i] = now // changed out of sight: its expiry starts now
		}
		w.leases[i] = l
	}
	w.rv = list.ResourceVersion
	return w.watch()
}

// watch follows the slots from the last version seen.
func (w *waiter) watch() (watch.Interface, error) {
	secs := int64((resync + mrand.N(resync+1)) / time.Second)
	opts := metav1.ListOptions{
		LabelSelector:       w.g.selector,
		ResourceVersion:     w.rv,
		TimeoutSeconds:      &secs,
		AllowWatchBookmarks: true,
	}
	return w.g.cfg.Client.Watch(w.ctx, opts)
}

// follow waits on the watch until it holds a slot. It returns (nil, nil)
// when the watch ends and the slots should be listed or watched again.
func (w *waiter) follow(stream watch.Interface) (*Holding, error) {
	g := w.g
	// One timer, for the aimed take or the next expiry: a timer per event
	// would cost every waiter per renewal.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := g.now()
		free, due := w.free(now)
		if len(free) == 0 && !w.loggedWait {
			w.loggedWait = true
			g.log.Info("all pull slots are busy; waiting", "slots", w.eligible(), "seeded", w.seeded)
		}
		w.aim.update(free, now, w.delay)
		if w.aim.slot >= 0 && (due.IsZero() || w.aim.at.Before(due)) {
			due = w.aim.at
		}
		if !due.IsZero() {
			timer.Reset(due.Sub(now))
		}
		select {
		case <-w.ctx.Done():
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
		case ev, ok := <-stream.ResultChan():
			if !ok {
				return nil, nil
			}
			w.apply(ev)
			if w.rv == "" {
				return nil, nil
			}
		case <-timer.C:
			i := w.aim.slot
			if i < 0 || g.now().Before(w.aim.at) {
				continue
			}
			w.aim.slot = -1 // whatever the outcome, aim anew
			h, err := w.take(stream, i)
			if h != nil || err != nil {
				return h, err
			}
		}
	}
}

// aim is the free slot a waiter means to write, and when. Each waiter
// aims at one free slot, so that the waiters split over the free slots
// and each freed slot is a race of its own among those aiming at it:
// about e^(p ÷ window/8) of them write whatever their number (delay). A
// waiter aims anew, with a new draw, when its slot is taken or it tried;
// a newly freed slot draws each waiter with a chance of one in the number
// of free slots, so that the aims stay spread evenly over the free slots
// however often slots change hands. One draw kept while any slot stayed
// free fired, at K = 100 and 1,000 nodes, with the others near the
// window's end: 13.5 writes per slot taken. A draw per free slot had
// each waiter write once per free slot: 208.
type aim struct {
	slot int       // -1: no free slot
	at   time.Time // when to write it
	free []int     // the free slots at the last update
}

// update aims after a change of the free slots; delay draws the wait
// before writing slot i.
func (a *aim) update(free []int, now time.Time, delay func(i int) time.Duration) {
	fresh := slices.DeleteFunc(slices.Clone(free), func(i int) bool { return slices.Contains(a.free, i) })
	a.free = free
	switch {
	case len(free) == 0:
		a.slot = -1
	case !slices.Contains(free, a.slot):
		a.slot = free[mrand.IntN(len(free))]
		a.at = now.Add(delay(a.slot))
	default:
		r := mrand.IntN(len(free))
		if r < len(fresh) {
			a.slot = fresh[r] // with the draw kept
		}
	}
}

// apply folds one watch event into what the waiter knows.
func (w *waiter) apply(ev watch.Event) {
	if ev.Type == watch.Error { // 410 Gone (too old to resume from), or another failure: list again
		w.g.log.Debug("the watch of the pull slots ended with an error; listing them again",
			"err", apierrors.FromObject(ev.Object))
		w.rv = ""
		return
	}
	l, ok := ev.Object.(*coordinationv1.Lease)
	if !ok {
		return
	}
	w.rv = l.ResourceVersion
	if ev.Type == watch.Bookmark {
		return
	}
	i := slices.Index(w.names, l.Name)
	if i < 0 {
		return // a slot above K
	}
	if ev.Type == watch.Deleted {
		l = nil
	}
	w.leases[i] = l
	w.since[i] = w.g.now()
}

// eligible is the number of slots that may be taken now.
func (w *waiter) eligible() int {
	if w.seeded {
		return w.g.cfg.Slots
	}
	return min(w.g.cfg.SeedNodes, w.g.cfg.Slots)
}

// free lists the eligible slots that may be taken now, and says when to
// look again: the next expiry of a held slot, or the end of a denial.
func (w *waiter) free(now time.Time) (free []int, next time.Time) {
	g := w.g
	for _, l := range w.leases {
		if !w.seeded && l != nil && l.Annotations[SeededAnnotation] == g.cfg.SeedKey {
			w.seeded = true
			g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
		}
	}
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for i := range w.eligible() {
		l := w.leases[i]
		if now.Before(w.deniedUntil[i]) {
			later(w.deniedUntil[i])
			continue
		}
		if l != nil && w.lostAt[i] == l {
			continue
		}
		h := holder(l)
		if w.isUnsure(h) {
			return []int{i}, time.Time{} // a lost answer's write: taken again at once
		}
		if h != "" {
			expiry := w.since[i].Add(g.duration(l))
			if now.Before(expiry) {
				later(expiry)
				continue
			}
		}
		free = append(free, i)
	}
	return free, next
}

// isUnsure says whether id is the holder of one of our unsure takes.
func (w *waiter) isUnsure(id string) bool {
	return id != "" && slices.ContainsFunc(w.unsure, func(t take) bool { return t.id == id })
}

// delay is the wait before writing slot i: the window less an
// exponential draw of mean window/8, not below 0, and not before a
// failed call's pause has passed; a slot that names an earlier take of
// ours (free then lists it alone) is taken at once.
func (w *waiter) delay(i int) time.Duration {
	d := draw(w.g.window)
	if w.isUnsure(holder(w.leases[i])) {
		d = 0
	}
	return max(d, w.quietUntil.Sub(w.g.now()))
}

func draw(window time.Duration) time.Duration {
	return max(0, window-time.Duration(mrand.ExpFloat64()*float64(window)/8))
}

// take writes us, with a holder new for this take, into slot i: an update
// on the version last seen, or a create if none. A Lease that names an
// earlier take of ours comes from a write whose answer never came and
// which the watch showed only later: it is written again, so that the
// slot counts as held from a write this node sent, not from when it
// noticed.
func (w *waiter) take(stream watch.Interface, i int) (*Holding, error) {
	g := w.g
	name := w.names[i]
	l := w.leases[i]
	verb := "update"
	write := g.update
	w.id = fmt.Sprintf("%s-%08x", g.cfg.Identity, mrand.Uint32())
	h := holder(l)
	switch {
	case l == nil:
		// RBAC cannot limit create by name, but it limits get: the read
		// refuses a slot above a lowered maxConcurrentNodes.
		got, err := g.get(w.ctx, name)
		if err == nil {
			// Made without our labels (by an older agent) or not shown
			// yet: judged from now like any other, taken by an update.
			w.leases[i] = got
			w.since[i] = g.now()
			return nil, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, w.failed("get", i, nil, err)
		}
		verb = "create"
		write = g.create
	case h != "" && !w.isUnsure(h):
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", h)
	}
	seed := !w.seeded
	sent := g.now()
	lease := g.taken(l, i, w.id, sent)
	held, err := w.send(stream, i, func(ctx context.Context) (*coordinationv1.Lease, error) {
		return write(ctx, lease)
	})
	if err != nil {
		return nil, w.failed(verb, i, l, err)
	}
	// Earlier takes of other slots whose answer never came may still
	// land; the holding clears any that does.
	pending := slices.DeleteFunc(slices.Clone(w.unsure), func(t take) bool { return t.slot == i })
	return g.newHolding(w.ctx, held, i, w.id, seed, sent, pending), nil
}

// send makes a take's write of slot i while it reads the watch, and
// returns the Lease as written from the answer or the watch, whichever
// comes first: a write whose answer is lost (a dropped connection, an
// apiserver that stops answering) shows in the watch long before the
// call's timeout. Our holder is new for every take, so a Lease naming it
// comes from this write. A watch that ends leaves the write to its answer.
//
// The write does not end with the wait's context: a write cut off by a
// SIGTERM may have been made all the same. So once the context ends, the
// write's answer is awaited and what it may have written is cleared
// (abandon), lest the slot name a holder nobody renews.
func (w *waiter) send(stream watch.Interface, i int,
	write func(context.Context) (*coordinationv1.Lease, error)) (*coordinationv1.Lease, error) {
	var held *coordinationv1.Lease
	var err error
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		held, err = write(context.WithoutCancel(w.ctx))
	}()
	result := func() (*coordinationv1.Lease, error) { return held, err }
	events := stream.ResultChan()
	for {
		// An ended wait wins over an answer or an event that came with it:
		// the slot is cleared, not held by a node that stops.
		if w.ctx.Err() != nil {
			w.abandon(i, w.id, answered, result)
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
		}
		select {
		case <-answered:
			if w.ctx.Err() != nil {
				continue
			}
			return result()
		case <-w.ctx.Done():
		case ev, ok := <-events:
			if !ok {
				events = nil // follow sees it ended once the write is answered
				continue
			}
			w.apply(ev)
			if holder(w.leases[i]) == w.id && w.ctx.Err() == nil {
				return w.leases[i], nil
			}
		}
	}
}

// abandon clears slot i of the take id in flight when the wait ended:
// within Config.ReleaseGrace, it waits for the write's answer for half
// of it, then clears the Lease if it names id. result is the answer, once
// answered is closed.
func (w *waiter) abandon(i int, id string, answered <-chan struct{},
	result func() (*coordinationv1.Lease, error)) {
	g := w.g
	grace := g.cfg.ReleaseGrace
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: w.names[i]}}
	select {
	case <-answered:
		if held, err := result(); err == nil {
			cur = held
		}
	case <-time.After(grace / 2):
	}
	if err := g.disown(ctx, cur, id); err != nil {
		g.log.Error("could not clear the pull slot a take cut short by termination may have written;"+
			" it frees itself after the lease duration", "slot", w.names[i], "holder", id, "err", err)
	}
}

// failed handles a failed call for slot i as seen: a lost race skips the
// slot until a newer version of it comes (a lost create is not skipped:
// the next take reads the Lease first); another failure holds the next
// write back. It returns an error only when waiting cannot help.
func (w *waiter) failed(verb string, i int, seen *coordinationv1.Lease, err error) error {
	g := w.g
	switch {
	case kube.Refused(err):
		return w.denied(verb, i, err)
	case permanent(err):
		return fmt.Errorf("%s Lease %s/%s: %w", verb, g.cfg.Namespace, w.names[i], err)
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err):
		w.lostAt[i] = seen // another node wrote first; follow aims anew
		return nil
	}
	g.log.Warn("pull slot API call failed; backing off", "verb", verb, "slot", w.names[i], "err", err)
	if verb != "get" {
		w.unsure = append(w.unsure, take{id: w.id, slot: i, sent: g.now()})
	}
	w.quietUntil = g.now().Add(w.backOff())
	return nil
}

// denied skips a slot the API refused us (403, 401) for a pause, 1 s
// doubling to 30 s: a lowered maxConcurrentNodes refuses it for good, a
// restarting apiserver for seconds. The wait ends once the API has
// refused every eligible slot for RefusedFor.
func (w *waiter) denied(verb string, i int, err error) error {
	g := w.g
	now := g.now()
	pause := cmp.Or(w.deniedPause[i], g.retry)
	w.deniedPause[i] = min(2*pause, maxRetry)
	w.deniedUntil[i] = now.Add(pause)
	g.log.Warn("the API refused this pull slot (was maxConcurrentNodes lowered?); skipping it for a while",
		"slot", w.names[i], "verb", verb, "retryIn", pause.String(), "err", err)
	for j := range w.eligible() {
		if !now.Before(w.deniedUntil[j]) {
			return nil // another slot may still be taken
		}
	}
	return w.refused(verb+" every pull slot Lease in "+g.cfg.Namespace, err)
}

// refused ends the wait once the API has refused us for RefusedFor: a
// restarted apiserver refuses until its RBAC and token caches are filled.
func (w *waiter) refused(what string, err error) error {
	now := w.g.now()
	w.refusedSince = cmp.Or(w.refusedSince, now)
	if now.Sub(w.refusedSince) < w.g.cfg.RefusedFor {
		return nil
	}
	return fmt.Errorf("%s (refused for %s): %w", what, w.g.cfg.RefusedFor, err)
}
