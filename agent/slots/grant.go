package slots

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Handing slots to the queue (queue.go): a holder that is done, and the
// holders that look after the slots when they find idle ones (janitor.go).
// A grant is two writes: the slot, carrying the version it was judged at
// and naming the ticket's holder, then the ticket, marked granted. A grant
// whose node is gone is never renewed, so the slot expires and is handed
// on.

// tickets lists the queue, oldest first: tickets that name a holder and
// are not granted yet, but for skip (the caller's own). granted maps the
// holder of each granted ticket to its name.
func (g *Gate) tickets(ctx context.Context, skip string) (queue []coordinationv1.Lease, granted map[string]string,
	err error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	list, err := g.cfg.Client.List(ctx, metav1.ListOptions{LabelSelector: g.ticketSelector})
	if err != nil {
		return nil, nil, fmt.Errorf("list ticket Leases %s/%s: %w", g.cfg.Namespace, g.ticketSelector, err)
	}
	granted = map[string]string{}
	for _, l := range list.Items {
		if _, ok := l.Annotations[GrantedAnnotation]; ok {
			granted[holder(&l)] = l.Name
			continue
		}
		if l.Name != skip && holder(&l) != "" {
			queue = append(queue, l)
		}
	}
	slices.SortFunc(queue, queueOrder)
	return queue, granted, nil
}

// handOut hands the slots free (each as read in leases: free, expired, or
// made free by the caller) to the queue, oldest ticket first but skip. A
// slot written since it was read is skipped: someone else took it.
//
// seeded says that a seed has finished: the nodes handed a slot then do
// not pull as seeds.
func (g *Gate) handOut(ctx context.Context, leases []*coordinationv1.Lease, free []int, skip string, seeded bool) {
	queue, granted, err := g.tickets(ctx, skip)
	if err != nil {
		g.log.Warn("could not read the pull-slot queue; the holders that look after the slots hand them out",
			"err", err)
		return
	}
	for _, i := range free {
		prev := leases[i]
		// A slot handed to a ticket whose node never wrote it expired:
		// that ticket is gone with its node.
		if stale, ok := granted[holder(prev)]; ok && holder(prev) != "" {
			g.log.Info("a pull slot handed to a waiting node expired unused; deleting its ticket",
				"slot", prev.Name, "ticket", stale)
			g.deleteTicket(ctx, stale)
		}
		queue = g.grant(ctx, prev, i, queue, skip, seeded)
	}
}

// grant hands slot i, read as prev, to the oldest ticket of queue that can
// still be claimed, and returns the queue left. A ticket another holder
// claimed since we listed, or that went (its node took another slot),
// makes us list the queue again: a list read a while ago would send us
// down tickets granted meanwhile, each costing writes. After maxClaims
// failed claims the slot is cleared, and the holders that look after the
// slots hand it out.
func (g *Gate) grant(ctx context.Context, prev *coordinationv1.Lease, i int, queue []coordinationv1.Lease, skip string,
	seeded bool) []coordinationv1.Lease {
	tried := map[string]bool{}
	for range maxClaims {
		if len(queue) == 0 {
			break
		}
		t := &queue[0]
		queue = queue[1:]
		// The slot first: a node that sees its grant finds the slot
		// naming it.
		written, err := g.writeSlot(ctx, prev, i, holder(t))
		if err != nil {
			return queue // someone else wrote the slot, or the API fails us
		}
		prev = written
		if g.markGranted(ctx, t, i, seeded) {
			return queue
		}
		tried[t.Name] = true
		queue, _, err = g.tickets(ctx, skip)
		if err != nil {
			break
		}
		queue = slices.DeleteFunc(queue, func(l coordinationv1.Lease) bool { return tried[l.Name] })
	}
	if written := prev; len(tried) > 0 {
		if err := g.disown(ctx, written, holder(written)); err != nil {
			g.log.Warn("could not clear a pull slot no ticket could be handed; it frees itself after the lease duration",
				"slot", written.Name, "err", err)
		}
	}
	return queue
}

// writeSlot writes id as the holder of slot i, read as prev (nil: not
// made yet); a slot written since it was read is someone else's now.
func (g *Gate) writeSlot(ctx context.Context, prev *coordinationv1.Lease, i int,
	id string) (*coordinationv1.Lease, error) {
	next := g.taken(prev, i, id, g.now())
	write := g.update
	if prev == nil {
		write = g.create
	}
	written, err := write(ctx, next)
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
		g.log.Warn("could not hand a pull slot to the queue", "slot", next.Name, "err", err)
	}
	return written, err
}

// markGranted tells ticket t's node that slot i names it, and whether a
// seed has finished. It reports whether the ticket was still as listed.
func (g *Gate) markGranted(ctx context.Context, t *coordinationv1.Lease, i int, seeded bool) bool {
	marks := map[string]string{GrantedAnnotation: strconv.Itoa(i)}
	if seeded {
		marks[SeededAnnotation] = g.cfg.SeedKey
	}
	return g.annotate(ctx, t, marks)
}

// annotate sets marks on ticket t as listed: one write, refused if the
// ticket changed since (another holder claimed it, or it went). Failing
// costs time, not safety: a grant the node never hears of expires, and
// the slot is handed on.
func (g *Gate) annotate(ctx context.Context, t *coordinationv1.Lease, marks map[string]string) bool {
	next := t.DeepCopy()
	next.Annotations = labels.Merge(next.Annotations, marks)
	_, err := g.update(ctx, next)
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		g.log.Warn("could not mark a pull-slot ticket", "ticket", t.Name, "marks", marks, "err", err)
	}
	return err == nil
}

// release clears our slot (seeded: recording that the seed finished) and
// hands it to the queue; a seed also hands out every slot the seed mode
// kept closed. Reading the tickets after the clear is written means that
// a node that wrote its ticket before we read sees us hand it the slot,
// and one that wrote it after finds the slot free when it looks.
func (h *Holding) release(ctx context.Context, seeded bool) error {
	g := h.g
	cleared, err := h.clear(ctx, seeded)
	if err != nil || cleared == nil {
		return err
	}
	// Logged before the hand-out: the node handed the slot may log its
	// take before our hand-out returns.
	g.log.Info("released pull slot", "slot", h.Name(), "seeded", seeded)
	leases := make([]*coordinationv1.Lease, g.cfg.Slots)
	leases[h.slot] = cleared
	free := []int{h.slot}
	done := cleared.Annotations[SeededAnnotation] == g.cfg.SeedKey || g.cfg.SeedNodes == 0
	if seeded {
		leases, free, err = g.vacant(ctx)
		if err != nil {
			g.log.Warn("could not read the pull slots to open them after seeding;"+
				" the holders that look after the slots do", "err", err)
			return nil
		}
	}
	g.handOut(ctx, leases, free, "", done)
	return nil
}

// vacant lists the slots that no one holds, missing ones included.
func (g *Gate) vacant(ctx context.Context) ([]*coordinationv1.Lease, []int, error) {
	lctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	list, err := g.cfg.Client.List(lctx, metav1.ListOptions{LabelSelector: g.selector})
	if err != nil {
		return nil, nil, fmt.Errorf("list Leases %s/%s: %w", g.cfg.Namespace, g.selector, err)
	}
	leases := make([]*coordinationv1.Lease, g.cfg.Slots)
	for j := range list.Items {
		if i := g.slotIndex(list.Items[j].Name); i >= 0 {
			leases[i] = &list.Items[j]
		}
	}
	var free []int
	for i, l := range leases {
		if holder(l) == "" {
			free = append(free, i)
		}
	}
	return leases, free, nil
}
