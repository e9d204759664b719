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

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// Waiting. A waiter writes its ticket, looks at the slots once and takes
// a free one, or else waits in the queue (queue.go). A take is one write
// carrying the version read: of racing nodes the apiserver accepts one,
// and the others wait in the queue. A failed write backs off, 1 s doubling
// to 30 s; a refused one (403, 401) skips the slot for a pause, and the
// wait ends once every eligible slot has been refused for RefusedFor.
const (
	minRetry = time.Second // the pauses after a failed API call
	maxRetry = 30 * time.Second
	resync   = 5 * time.Minute // a watch asks to end after 5-10 min
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
	// By slot, as last listed or read: leases, the Lease.
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
	// listedAt is when the slots were last listed.
	listedAt time.Time
	// ticketID is the holder our ticket, ticketName, names: a grant
	// writes it into a slot. Each take names a holder of its own (id).
	ticketID   string
	ticketName string
	// ticketRV is our ticket's version as last written or seen.
	ticketRV string
	// alone: ours was the only ticket, so we look at the slots.
	alone bool
	// tryAgain: a take failed or was refused; look again after its pause.
	tryAgain bool
	// recovering: the API failed us. Holders may have lost their slots
	// meanwhile, leaving none to look after the slots: we look every lease
	// duration until a look sees a holder of a first slot renew it since
	// our last look (see renewing). Looking for the rest of the wait cost
	// 3.4 requests a minute per waiting node in the n1000-k100 scale run,
	// where many waiters had a call time out in the start's stampede.
	recovering bool
	// recoverBase: a look since the failure gave us the versions to
	// compare with.
	recoverBase bool
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

// wait waits in the queue until it holds a slot.
func (w *waiter) wait() (*Holding, error) {
	return w.queue()
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

// eligible is the number of slots that may be taken now.
func (w *waiter) eligible() int {
	if w.seeded {
		return w.g.cfg.Slots
	}
	return min(w.g.cfg.SeedNodes, w.g.cfg.Slots)
}

// free lists the eligible slots that may be taken now. When to look again
// is lookTimer's: waiters no longer wait on a held slot's expiry.
func (w *waiter) free(now time.Time) (free []int) {
	g := w.g
	for _, l := range w.leases {
		if !w.seeded && l != nil && l.Annotations[SeededAnnotation] == g.cfg.SeedKey {
			w.seeded = true
			g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
		}
	}
	for i := range w.eligible() {
		l := w.leases[i]
		if now.Before(w.deniedUntil[i]) {
			continue
		}
		if l != nil && w.lostAt[i] == l {
			continue
		}
		h := holder(l)
		if w.isUnsure(h) {
			return []int{i} // a lost answer's write: taken again at once
		}
		if h != "" && h == w.ticketID {
			return []int{i} // handed to us: a grant our watch has not shown yet
		}
		if h != "" && now.Before(w.since[i].Add(g.duration(l))) {
			continue // held, not expired on our clock
		}
		free = append(free, i)
	}
	return free
}

// isUnsure says whether id is the holder of one of our unsure takes.
func (w *waiter) isUnsure(id string) bool {
	return id != "" && slices.ContainsFunc(w.unsure, func(t take) bool { return t.id == id })
}

// take writes us, with a holder new for this take, into slot i: an update
// on the version last seen, or a create if none. A Lease that names an
// earlier take of ours comes from a write whose answer never came and
// which the watch showed only later: it is written again, so that the
// slot counts as held from a write this node sent, not from when it
// noticed.
func (w *waiter) take(i int) (*Holding, error) {
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
	case h != "" && !w.isUnsure(h) && h != w.ticketID:
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", h)
	}
	seed := !w.seeded
	sent := g.now()
	lease := g.taken(l, i, w.id, sent)
	if l != nil && holder(l) == w.ticketID {
		// Handed to us: the grant and this write are one transition.
		lease.Spec.LeaseTransitions = l.Spec.LeaseTransitions
	}
	held, err := w.send(i, func(ctx context.Context) (*coordinationv1.Lease, error) {
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

// send makes a take's write of slot i and returns the Lease as written.
//
// The write does not end with the wait's context: a write cut off by a
// SIGTERM may have been made all the same. So once the context ends, the
// write's answer is awaited and what it may have written is cleared
// (abandon), lest the slot name a holder nobody renews.
func (w *waiter) send(i int,
	write func(context.Context) (*coordinationv1.Lease, error)) (*coordinationv1.Lease, error) {
	var held *coordinationv1.Lease
	var err error
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		held, err = write(context.WithoutCancel(w.ctx))
	}()
	result := func() (*coordinationv1.Lease, error) { return held, err }
	select {
	case <-answered:
	case <-w.ctx.Done():
	}
	// An ended wait wins over an answer that came with it: the slot is
	// cleared, not held by a node that stops.
	if w.ctx.Err() != nil {
		w.abandon(i, w.id, answered, result)
		return nil, w.ended()
	}
	return result()
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
	w.tryAgain = true
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
	w.tryAgain = true
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
