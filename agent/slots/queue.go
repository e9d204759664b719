package slots

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// The queue. A node that finds every slot busy does not watch the slots:
// each holder renews every 5 s, so a waiter watching K slots would get
// K × 12 events a minute from heartbeats alone, and every hand-over on
// top. It writes a ticket instead, a Lease of its own for this wait, and
// watches that one Lease. The tickets, oldest first, are the queue:
//
//   - A holder that is done clears its slot, reads the tickets and hands
//     the slot to the oldest: it writes the ticket's holder into the slot,
//     then claims the ticket (GrantedAnnotation, refused if another holder
//     claimed it first). The granted node writes the slot again under its
//     own holder and pulls.
//   - The holders of the first slots look after the others (janitor.go):
//     a slot whose holder died, or handed to a ticket whose node has gone,
//     goes to the queue once it is unchanged for its lease duration.
//
// So a waiting node sends a write and two lists when it starts to wait
// (the second tells whether it is alone: then it looks at the slots
// itself every few seconds), and keeps one watch of its own ticket; its
// watch shows a grant, nothing else. Every waiter also looks at the slots
// when its watch ends, every 5-10 min, in case no holder looks after them
// (their nodes died). The slot Leases stay the only record of who holds:
// every write of a slot carries the version it was read at, so the queue
// can delay a hand-over but never make a K+1st holder.
const (
	// LabelComponentTicket labels the tickets.
	LabelComponentTicket = "pull-ticket"
	// GrantedAnnotation on a ticket names the slot written for its holder.
	GrantedAnnotation = v1alpha1.LabelDomain + "/granted-slot"

	// maxTries is how many free slots one look writes at most, one after
	// the other while each race is lost.
	maxTries = 3
	// maxClaims is how many tickets one hand-over of a slot tries at
	// most, each claimed by another holder, or gone, before it.
	maxClaims = 5
	// alonePoll is how often a waiter alone in the queue lists the slots.
	alonePoll = 5 * time.Second
	// listPeriod: at most one list or watch a second, whatever fails.
	listPeriod = time.Second
)

// ticketName is the ticket of a wait whose holder is id: one per wait,
// so that two waits never share one, whatever runs them.
func ticketName(instance, id string) string {
	sum := sha256.Sum256([]byte(id))
	return fmt.Sprintf("%s-wait-%x", instance, sum[:8])
}

// queue waits in the queue until it holds a slot. Each round writes our
// ticket first and reads the slots second, and a holder that frees a slot
// reads the tickets after it wrote the slot: so either the holder sees our
// ticket or we see its free slot.
func (w *waiter) queue() (*Holding, error) {
	g := w.g
	w.ticketID = fmt.Sprintf("%s-%08x", g.cfg.Identity, mrand.Uint32())
	w.ticketName = ticketName(g.cfg.Instance, w.ticketID)
	var pause time.Duration
	for {
		if !sleep(w.ctx, max(pause, w.listedAt.Add(listPeriod).Sub(g.now()))) {
			return nil, w.ended()
		}
		pause = 0
		h, err := w.queueRound()
		if h != nil {
			return h, nil
		}
		if err == nil || w.ctx.Err() != nil {
			continue
		}
		if permanent(err) {
			return nil, err
		}
		if kube.Refused(err) {
			// For good under an old Role; for a moment after a restart.
			what := "list, watch and write Leases in " + g.cfg.Namespace +
				" (the Role needs them for the queue: render the instance again)"
			if err := w.refused(what, err); err != nil {
				return nil, err
			}
		}
		pause = w.backOff()
		w.recovering = true
		w.recoverBase = false
		g.log.Warn("waiting in the pull-slot queue failed; will retry",
			"retryIn", pause.Round(time.Millisecond).String(), "err", err)
	}
}

func (w *waiter) ended() error {
	return fmt.Errorf("waiting for a pull slot: %w", context.Cause(w.ctx))
}

// queueRound writes our ticket, looks at the slots once and takes a free
// one, or else follows our ticket (nil, nil: write it again).
func (w *waiter) queueRound() (*Holding, error) {
	g := w.g
	t, err := w.writeTicket()
	if err != nil {
		return nil, err
	}
	w.retry = g.retry // the API answers again; failed takes from here double the pause
	if s, ok := t.Annotations[GrantedAnnotation]; ok {
		if h, err := w.granted(s); h != nil || err != nil {
			return h, err
		}
		if err := w.clearGrant(); err != nil {
			return nil, err
		}
	}
	if h, err := w.lookAndTake(); h != nil || err != nil {
		return h, err
	}
	if !w.alone {
		if w.alone, err = w.aloneInQueue(); err != nil {
			return nil, err
		}
	}
	if !w.loggedWait {
		w.loggedWait = true
		g.log.Info("all pull slots are busy; waiting in the queue", "slots", w.eligible(), "seeded", w.seeded,
			"ticket", t.Name)
	}
	return w.followTicket(t)
}

// writeTicket creates our ticket, or writes it afresh if it is there (a
// create whose answer was lost), naming w.ticketID as holder.
func (w *waiter) writeTicket() (*coordinationv1.Lease, error) {
	g := w.g
	name := w.ticketName
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.cfg.Namespace}}
	g.ticketed(lease, w.ticketID)
	made, err := g.create(w.ctx, lease)
	if err == nil {
		w.ticketRV = made.ResourceVersion
		return made, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create ticket Lease %s/%s: %w", g.cfg.Namespace, name, err)
	}
	cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
	// rewrite retries until its context ends: one call's time, so that a
	// refusal (an old Role) reaches the round, which gives up on it.
	ctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	defer cancel()
	made, err = g.rewrite(ctx, cur, func(l *coordinationv1.Lease) (bool, error) {
		g.ticketed(l, w.ticketID)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("write ticket Lease %s/%s: %w", g.cfg.Namespace, name, err)
	}
	w.ticketRV = made.ResourceVersion
	return made, nil
}

// ticketed makes l a ticket naming id. A grant stays: the slot
// names us, and the round takes it (queueRound).
func (g *Gate) ticketed(l *coordinationv1.Lease, id string) {
	l.Labels = labels.Merge(l.Labels, map[string]string{
		LabelName:      "image-prefetcher",
		LabelInstance:  g.cfg.Instance,
		LabelComponent: LabelComponentTicket,
	})
	l.Spec = coordinationv1.LeaseSpec{HolderIdentity: &id}
}

// clearGrant removes a grant our ticket carries whose slot no longer names
// us (taken over after it expired), so that the queue hands us another.
func (w *waiter) clearGrant() error {
	g := w.g
	cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: w.ticketName}}
	ctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	defer cancel()
	made, err := g.rewrite(ctx, cur, func(l *coordinationv1.Lease) (bool, error) {
		if _, ok := l.Annotations[GrantedAnnotation]; !ok {
			return false, nil
		}
		delete(l.Annotations, GrantedAnnotation)
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("write ticket Lease %s/%s: %w", g.cfg.Namespace, w.ticketName, err)
	}
	w.ticketRV = made.ResourceVersion
	return nil
}

// lookAndTake lists the slots and takes one that may be taken: free, ours
// from a take whose answer never came, or expired (seen unchanged for its
// lease duration, which only a waiter alone and rare looks see). Writes go
// out at once, one after the other while races are lost, at most
// maxTries: a waiter that loses them waits in the queue.
func (w *waiter) lookAndTake() (*Holding, error) {
	g := w.g
	w.tryAgain = false
	if err := w.listSlots(); err != nil {
		return nil, err
	}
	w.refusedSince = time.Time{}
	free := w.free(g.now())
	mrand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	// A lost race moves on to the next free slot; a failed write pauses.
	for _, i := range free[:min(len(free), maxTries)] {
		h, err := w.take(i)
		if err != nil || w.tryAgain || h != nil {
			return h, err
		}
	}
	return nil, nil
}

// aloneInQueue says whether ours is the only ticket of a node that waits:
// then we look at the slots ourselves, as no holder may be left to look
// after them (K = 1, or every holder's node died). A ticket whose node
// holds a slot as we last listed them does not count: that node has just
// taken it and deletes its ticket next, and had we counted it, its death
// would leave the slot to our watch's end (5-10 min). Three tickets are
// enough to tell: ours, a leaving one, and one of a node that waits.
func (w *waiter) aloneInQueue() (bool, error) {
	g := w.g
	ctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	defer cancel()
	list, err := g.cfg.Client.List(ctx, metav1.ListOptions{LabelSelector: g.ticketSelector, Limit: 3})
	if err != nil {
		return false, fmt.Errorf("list ticket Leases %s/%s: %w", g.cfg.Namespace, g.ticketSelector, err)
	}
	holding := map[string]bool{}
	for _, l := range w.leases {
		if h := holder(l); h != "" {
			holding[identityOf(h)] = true
		}
	}
	for _, t := range list.Items {
		if t.Name != w.ticketName && !holding[identityOf(holder(&t))] {
			return false, nil
		}
	}
	return list.Continue == "", nil
}

// identityOf is the Config.Identity that made a holder: every ticket and
// take names Identity-<8 hex>, so a ticket and a slot name the same node
// when their holders share it.
func identityOf(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 {
		return id[:i]
	}
	return id
}

// listSlots reads the instance's slots; a version seen before keeps the
// time we first saw it, so that expiry is judged on our clock.
func (w *waiter) listSlots() error {
	g := w.g
	w.listedAt = g.now()
	lctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	list, err := g.cfg.Client.List(lctx, metav1.ListOptions{LabelSelector: g.selector})
	cancel()
	if err != nil {
		return fmt.Errorf("list Leases %s/%s: %w", g.cfg.Namespace, g.selector, err)
	}
	now := g.now()
	old := w.leases
	w.leases = make([]*coordinationv1.Lease, len(w.names))
	for j := range list.Items {
		l := &list.Items[j]
		i := slices.Index(w.names, l.Name)
		if i < 0 {
			continue
		}
		if old[i] == nil || old[i].ResourceVersion != l.ResourceVersion {
			w.since[i] = now
		}
		w.leases[i] = l
	}
	if w.recovering {
		if w.recoverBase && w.renewing(old) {
			w.recovering = false
		}
		w.recoverBase = true
	}
	return nil
}

// renewing says whether a holder of one of the first slots, which looks
// after the slots (janitor.go), renewed its slot between the look that
// saw old and this one: same holder, newer version. A grant nobody took
// has no renewal; a hand-over changes the holder.
func (w *waiter) renewing(old []*coordinationv1.Lease) bool {
	for i := range min(janitors, len(w.leases)) {
		o, l := old[i], w.leases[i]
		if o != nil && l != nil && holder(l) != "" && holder(l) == holder(o) && l.ResourceVersion != o.ResourceVersion {
			return true
		}
	}
	return false
}

// followTicket watches our ticket alone until it is granted a slot (held
// once our own write of that slot succeeds) or must be written again. An
// ended watch is resumed from the last version seen, no sooner than a
// second after it started. One that ran its course (5-10 min) is resumed
// once we have looked at the slots, in case no holder looks after them:
// rarely, so that waiting stays nearly free, and not when the apiserver
// ends every watch at once (a restart), lest every waiter list at once.
func (w *waiter) followTicket(t *coordinationv1.Lease) (*Holding, error) {
	g := w.g
	rv := t.ResourceVersion
	for {
		// Before the call: the apiserver's timeout starts after it.
		started := g.now()
		stream, timeout, err := w.watchTicket(t.Name, rv)
		if err != nil {
			return nil, err
		}
		h, again, err := w.readTicket(stream, &rv)
		stream.Stop()
		if h != nil || err != nil || again {
			return h, err
		}
		lasted := g.now().Sub(started)
		if lasted < listPeriod && !sleep(w.ctx, listPeriod) {
			return nil, w.ended()
		}
		if lasted < timeout {
			continue
		}
		if h, err := w.lookAndTake(); h != nil || err != nil {
			return h, err
		}
	}
}

// lookTimer fires when to look at the slots before the watch ends: every
// alonePoll while we are alone in the queue, after a refused or failed
// take (its pause), and every lease duration after the API failed us
// until a holder is seen to look after the slots (see
// waiter.recovering). nil: not before the watch ends.
func (w *waiter) lookTimer() *time.Timer {
	g := w.g
	var d time.Duration
	set := false
	sooner := func(x time.Duration) {
		if !set || x < d {
			d = x
			set = true
		}
	}
	// From the last look, not from now: a watch that ends every few
	// seconds (410 Gone, a proxy's idle timeout) must not put looks off.
	now := g.now()
	if w.alone {
		sooner(w.listedAt.Add(alonePoll).Sub(now))
	}
	if w.tryAgain {
		sooner(w.againAt().Sub(now))
	}
	if w.recovering {
		sooner(w.listedAt.Add(g.cfg.LeaseDuration + time.Second).Sub(now))
	}
	if !set {
		return nil
	}
	return time.NewTimer(max(d, 0))
}

// againAt is when a refused or failed take may be tried again: the end of
// the pause after a failed write, or of the first denial to end.
func (w *waiter) againAt() time.Time {
	at := w.quietUntil
	for _, t := range w.deniedUntil {
		if t.After(w.g.now()) && (at.Before(w.g.now()) || t.Before(at)) {
			at = t
		}
	}
	return at
}

// watchTicket watches our ticket, asking the apiserver to end the watch
// after the timeout it returns.
func (w *waiter) watchTicket(name, rv string) (watch.Interface, time.Duration, error) {
	secs := int64((resync + mrand.N(resync+1)) / time.Second)
	stream, err := w.g.cfg.Client.Watch(w.ctx, metav1.ListOptions{
		FieldSelector:       fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion:     rv,
		TimeoutSeconds:      &secs,
		AllowWatchBookmarks: true,
	})
	return stream, time.Duration(secs) * time.Second, err
}

// readTicket reads the ticket's watch, and looks at the slots when
// lookTimer says, until the ticket is granted, must be written again
// (again: deleted), or the watch ends. Bookmarks keep the version to
// resume from recent, so that a watch of a ticket that never changes can
// be resumed. A watch that ends with an error (410 Gone: after an
// apiserver restart its watch cache starts past every version written
// before) is resumed from the version at which the ticket was read again.
func (w *waiter) readTicket(stream watch.Interface, rv *string) (h *Holding, again bool, err error) {
	timer := w.lookTimer()
	defer func() { stopTimer(timer) }()
	for {
		var look <-chan time.Time
		if timer != nil {
			look = timer.C
		}
		select {
		case <-w.ctx.Done():
			return nil, false, w.ended()
		case <-look:
			if h, err := w.lookAndTake(); h != nil || err != nil {
				return h, false, err
			}
			timer = w.lookTimer()
		case ev, ok := <-stream.ResultChan():
			if !ok {
				return nil, false, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, true, nil
			case watch.Error:
				l, at, err := w.readOwnTicket()
				if err != nil || l == nil {
					return nil, l == nil && err == nil, err
				}
				*rv = at
				h, again, _, err := w.ticketChanged(l)
				return h, again, err
			}
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			*rv = l.ResourceVersion
			if ev.Type == watch.Bookmark {
				continue
			}
			if h, again, done, err := w.ticketChanged(l); done {
				return h, again, err
			}
		}
	}
}

// readOwnTicket reads our ticket (nil: gone) with a list, whose version is
// the apiserver's current one: a watch resumes from there, where the
// ticket's own version may be too old to watch from.
func (w *waiter) readOwnTicket() (*coordinationv1.Lease, string, error) {
	g := w.g
	ctx, cancel := context.WithTimeout(w.ctx, g.cfg.CallTimeout)
	defer cancel()
	list, err := g.cfg.Client.List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", w.ticketName).String(),
	})
	if err != nil {
		return nil, "", fmt.Errorf("read ticket Lease %s/%s: %w", g.cfg.Namespace, w.ticketName, err)
	}
	if len(list.Items) == 0 {
		return nil, list.ResourceVersion, nil
	}
	return &list.Items[0], list.ResourceVersion, nil
}

// ticketChanged acts on our ticket as read: a grant is taken (done).
func (w *waiter) ticketChanged(l *coordinationv1.Lease) (h *Holding, again, done bool, err error) {
	g := w.g
	w.ticketRV = l.ResourceVersion
	if holder(l) != w.ticketID {
		return nil, true, true, nil
	}
	if l.Annotations[SeededAnnotation] == g.cfg.SeedKey && !w.seeded {
		w.seeded = true
		g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
	}
	if s, ok := l.Annotations[GrantedAnnotation]; ok {
		h, err := w.granted(s)
		return h, h == nil && err == nil, true, err
	}
	return nil, false, false, nil
}

// granted takes the slot a holder handed us: it must still name us, and
// we write it again under our holder, from the version read, before we
// pull. A grant that does not hold (the slot was taken over meanwhile)
// sends us to the queue again.
func (w *waiter) granted(s string) (*Holding, error) {
	g := w.g
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= len(w.names) {
		g.log.Warn("a ticket names a slot this instance does not have; ignoring it", "slot", s)
		return nil, nil
	}
	got, err := g.get(w.ctx, w.names[i])
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		// The round is tried again, grant and all (ticketed keeps it).
		return nil, fmt.Errorf("read the pull slot %s handed to us: %w", w.names[i], err)
	}
	w.leases[i] = got
	w.since[i] = g.now()
	if holder(got) != w.ticketID {
		g.log.Info("a pull slot handed to this node was taken over before it could take it; waiting again",
			"slot", w.names[i])
		return nil, nil
	}
	// Named by our ticket, the slot is ours to write again at once.
	w.unsure = append(w.unsure, take{id: w.ticketID, slot: i, sent: g.now()})
	return w.take(i)
}

// leave deletes our ticket once the wait is over: within
// Config.ReleaseGrace if it ended with its context, within a call's
// timeout otherwise (a ticket left behind costs a slot a lease duration
// when it is handed one). A holder may have handed the ticket a slot
// while we took another (held): the delete, made on the ticket's version
// as we last saw it, fails then, and that slot is handed on.
func (w *waiter) leave(held *Holding) {
	g := w.g
	if w.ticketName == "" {
		return
	}
	grace := g.cfg.CallTimeout
	if w.ctx.Err() != nil {
		grace = g.cfg.ReleaseGrace
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), grace)
	defer cancel()
	rv := w.ticketRV
	onVersion := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}
	err := g.cfg.Client.Delete(ctx, w.ticketName, onVersion)
	if apierrors.IsConflict(err) {
		w.returnGrant(ctx, held)
		err = g.cfg.Client.Delete(ctx, w.ticketName, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		g.log.Warn("could not delete this node's pull-slot ticket; a slot handed to it goes back to the queue"+
			" after the lease duration, and the ticket goes then", "ticket", w.ticketName, "err", err)
	}
}

// returnGrant hands on the slot our ticket was granted, if it is not the
// one we hold and still names the ticket.
func (w *waiter) returnGrant(ctx context.Context, held *Holding) {
	g := w.g
	t, err := g.get(ctx, w.ticketName)
	if err != nil {
		return
	}
	i, err := strconv.Atoi(t.Annotations[GrantedAnnotation])
	if err != nil || i < 0 || i >= len(w.names) || (held != nil && held.slot == i) {
		return
	}
	cleared, err := g.rewrite(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: w.names[i]}},
		func(l *coordinationv1.Lease) (bool, error) {
			if holder(l) != w.ticketID {
				return false, nil
			}
			g.vacate(l)
			return true, nil
		})
	if err != nil || holder(cleared) != "" {
		return
	}
	leases := make([]*coordinationv1.Lease, len(w.names))
	leases[i] = cleared
	g.handOut(ctx, leases, []int{i}, w.ticketName, w.seeded)
}

// deleteTicket removes a ticket whose node is gone.
func (g *Gate) deleteTicket(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	err := g.cfg.Client.Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		g.log.Warn("could not delete this node's pull-slot ticket; a slot handed to it frees itself"+
			" after the lease duration, and the ticket goes then", "ticket", name, "err", err)
	}
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// queueOrder sorts tickets oldest first (creation time, then name).
func queueOrder(a, b coordinationv1.Lease) int {
	return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
}
