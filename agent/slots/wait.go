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
	// id: our holder in the last take, new for every take; unsure: those
	// of takes whose answer never came (a Lease naming one is ours).
	id     string
	unsure []string
	names  []string
	// By slot: free looks at every slot at every event, which by name
	// took 9 µs at K = 100, 3.6 times the event's decoding (3.3 µs by
	// slot; BenchmarkWaiterEvent). The latest version of each Lease; when
	// we first saw it at that version, on our clock; the version we lost
	// a race on, skipped till it changes.
	leases, lostAt []*coordinationv1.Lease
	since          []time.Time
	seeded         bool
	// retry is the next pause after a failed API call; no write goes out
	// before quietUntil.
	retry      time.Duration
	quietUntil time.Time
	// denied: the slots the API refused (a lowered maxConcurrentNodes);
	// refusedSince: since when it refuses every slot, or the list.
	denied       []bool
	refusedSince time.Time
	loggedWait   bool
	// rv: the last version seen, where a watch resumes ("" after a 410
	// Gone: list again); listedAt: the last list.
	rv       string
	listedAt time.Time
	aim      aim
}

func (g *Gate) newWaiter(ctx context.Context) *waiter {
	w := &waiter{
		g: g, ctx: ctx,
		seeded: g.cfg.SeedNodes == 0, retry: g.retry, aim: aim{slot: -1},
		leases: make([]*coordinationv1.Lease, g.cfg.Slots), lostAt: make([]*coordinationv1.Lease, g.cfg.Slots),
		since: make([]time.Time, g.cfg.Slots), denied: make([]bool, g.cfg.Slots),
	}
	for i := range g.cfg.Slots {
		w.names = append(w.names, SlotName(g.cfg.Instance, i))
	}
	return w
}

// wait lists and watches the slots until it holds one.
func (w *waiter) wait() (*Holding, error) {
	g := w.g
	var pause time.Duration // after a failure; and lists come at most once a second
	for ; sleep(w.ctx, max(pause, w.listedAt.Add(listPeriod).Sub(g.now()))); pause = 0 {
		stream, err := w.list()
		for err == nil {
			w.refusedSince, w.retry = time.Time{}, g.retry
			started, seen := g.now(), w.rv
			var h *Holding
			h, err = w.follow(stream)
			stream.Stop()
			if h != nil || err != nil {
				return h, err
			}
			if w.rv == "" || g.now().Sub(started) < time.Second && w.rv == seen {
				break // gone, or ended at once with nothing in it: list again
			}
			stream, err = w.watch()
		}
		if err == nil || w.ctx.Err() != nil {
			continue
		}
		if permanent(err) {
			return nil, fmt.Errorf("list Leases %s/%s: %w", g.cfg.Namespace, g.selector, err)
		}
		if apierrors.IsForbidden(err) { // for good under an old Role; for a moment after a restart
			if err := w.refused("list and watch Leases "+g.cfg.Namespace+" (the Role needs list and watch on leases: render the instance again)", err); err != nil {
				return nil, err
			}
		}
		pause = w.backOff()
		g.log.Warn("listing or watching the pull slots failed; will retry", "retryIn", pause.Round(time.Millisecond).String(), "err", err)
	}
	return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
}

// permanent errors end the wait: waiting cannot help.
func permanent(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsMethodNotSupported(err)
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
	list, err := g.cfg.Client.List(lctx, metav1.ListOptions{LabelSelector: g.selector})
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
		if o := old[i]; o == nil || o.ResourceVersion != l.ResourceVersion {
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
	return w.g.cfg.Client.Watch(w.ctx, metav1.ListOptions{LabelSelector: w.g.selector, ResourceVersion: w.rv, TimeoutSeconds: &secs, AllowWatchBookmarks: true})
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
			if i := w.aim.slot; i >= 0 && !g.now().Before(w.aim.at) {
				w.aim.slot = -1 // whatever the outcome, aim anew
				if h, err := w.take(stream, i); h != nil || err != nil {
					return h, err
				}
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
		if r := mrand.IntN(len(free)); r < len(fresh) {
			a.slot = fresh[r] // with the draw kept
		}
	}
}

// apply folds one watch event into what the waiter knows.
func (w *waiter) apply(ev watch.Event) {
	if ev.Type == watch.Error { // 410 Gone (too old to resume from), or another failure: list again
		w.g.log.Debug("the watch of the pull slots ended with an error; listing them again", "err", apierrors.FromObject(ev.Object))
		w.rv = ""
		return
	}
	l, ok := ev.Object.(*coordinationv1.Lease)
	if !ok {
		return
	}
	if w.rv = l.ResourceVersion; ev.Type == watch.Bookmark {
		return
	}
	i := slices.Index(w.names, l.Name)
	if i < 0 {
		return // a slot above K
	}
	if ev.Type == watch.Deleted {
		l = nil
	}
	w.leases[i], w.since[i] = l, w.g.now()
}

// eligible is the number of slots that may be taken now.
func (w *waiter) eligible() int {
	if w.seeded {
		return w.g.cfg.Slots
	}
	return min(w.g.cfg.SeedNodes, w.g.cfg.Slots)
}

// free lists the eligible slots that may be taken now, and says when to
// look again: the next expiry of a held slot.
func (w *waiter) free(now time.Time) (free []int, next time.Time) {
	g := w.g
	for _, l := range w.leases {
		if !w.seeded && l != nil && l.Annotations[SeededAnnotation] == g.cfg.SeedKey {
			w.seeded = true
			g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
		}
	}
	for i := range w.eligible() {
		l := w.leases[i]
		if w.denied[i] || l != nil && w.lostAt[i] == l {
			continue
		}
		switch h := holder(l); {
		case slices.Contains(w.unsure, h):
			return []int{i}, time.Time{} // a lost answer's write: taken again at once
		case h != "":
			if expiry := w.since[i].Add(g.duration(l)); now.Before(expiry) {
				if next.IsZero() || expiry.Before(next) {
					next = expiry
				}
				continue
			}
		}
		free = append(free, i)
	}
	return free, next
}

// delay is the wait before writing slot i: the window less an
// exponential draw of mean window/8, not below 0, and not before a
// failed call's pause has passed; a slot that names an earlier take of
// ours (free then lists it alone) is taken at once.
func (w *waiter) delay(i int) time.Duration {
	d := draw(w.g.window)
	if slices.Contains(w.unsure, holder(w.leases[i])) {
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
	name, l := w.names[i], w.leases[i]
	verb, write := "update", g.update
	w.id = fmt.Sprintf("%s-%08x", g.cfg.Identity, mrand.Uint32())
	switch h := holder(l); {
	case l == nil:
		// RBAC cannot limit create by name, but it limits get: the read
		// refuses a slot above a lowered maxConcurrentNodes.
		got, err := g.get(w.ctx, name)
		if err == nil {
			// Made without our labels (by an older agent) or not shown
			// yet: judged from now like any other, taken by an update.
			w.leases[i], w.since[i] = got, g.now()
			return nil, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, w.failed("get", i, nil, err)
		}
		verb, write = "create", g.create
	case h != "":
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", h)
	}
	seed, sent := !w.seeded, g.now()
	lease := g.taken(l, i, w.id, sent)
	held, err := w.send(stream, i, func(ctx context.Context) (*coordinationv1.Lease, error) { return write(ctx, lease) })
	if err != nil {
		return nil, w.failed(verb, i, l, err)
	}
	return g.newHolding(w.ctx, held, i, w.id, seed, sent), nil
}

// send makes a take's write of slot i while it reads the watch, and
// returns the Lease as written from the answer or the watch, whichever
// comes first: a write whose answer is lost (a dropped connection, an
// apiserver that stops answering) shows in the watch long before the
// call's timeout. Our holder is new for every take, so a Lease naming it
// comes from this write. A watch that ends leaves the write to its answer.
// A call the watch answered first is left to end on its own, within its
// timeout: cancelled, client-go logs an error for a write that was made.
func (w *waiter) send(stream watch.Interface, i int, write func(context.Context) (*coordinationv1.Lease, error)) (*coordinationv1.Lease, error) {
	var held *coordinationv1.Lease
	var err error
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		held, err = write(w.ctx)
	}()
	events := stream.ResultChan()
	for {
		select {
		case <-answered:
			return held, err
		case ev, ok := <-events:
			if !ok {
				events = nil // follow sees it ended once the write is answered
				continue
			}
			w.apply(ev)
			if l := w.leases[i]; holder(l) == w.id {
				return l, nil
			}
		}
	}
}

// failed handles a failed call for slot i as seen: a lost race skips the
// slot until a newer version of it comes (a lost create is not skipped:
// the next take reads the Lease first); another failure holds the next
// write back. It returns an error only when waiting cannot help.
func (w *waiter) failed(verb string, i int, seen *coordinationv1.Lease, err error) error {
	g := w.g
	switch {
	case apierrors.IsForbidden(err):
		return w.forbidden(verb, i, err)
	case permanent(err):
		return fmt.Errorf("%s Lease %s/%s: %w", verb, g.cfg.Namespace, w.names[i], err)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
		w.lostAt[i] = seen // another node wrote first; follow aims anew
		return nil
	}
	g.log.Warn("pull slot API call failed; backing off", "verb", verb, "slot", w.names[i], "err", err)
	w.unsure = append(w.unsure, w.id)
	w.quietUntil = g.now().Add(w.backOff())
	return nil
}

// forbidden skips a slot the API refused us; the wait ends once every
// eligible slot was refused for ForbiddenFor.
func (w *waiter) forbidden(verb string, i int, err error) error {
	g := w.g
	w.denied[i] = true // free skips it from now on
	g.log.Warn("not allowed to use this pull slot (was maxConcurrentNodes lowered?); skipping it", "slot", w.names[i], "verb", verb, "err", err)
	if slices.Contains(w.denied[:w.eligible()], false) {
		return nil
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
	w.refusedSince = cmp.Or(w.refusedSince, now)
	if now.Sub(w.refusedSince) < w.g.cfg.ForbiddenFor {
		return nil
	}
	return fmt.Errorf("%s (refused for %s): %w", what, w.g.cfg.ForbiddenFor, err)
}
