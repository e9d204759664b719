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
// head of the queue when it finds free or expired slots. A grant is two
// writes: the slot, carrying the version it was judged at and naming the
// ticket's holder, then the ticket, marked granted. A grant whose node is
// gone is never renewed, so the slot expires and the head hands it on.

// tickets lists the queue, oldest first: tickets that name a holder and
// are not granted yet, but for skip (the caller's own).
func (g *Gate) tickets(ctx context.Context, skip string) ([]coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	list, err := g.cfg.Client.List(ctx, metav1.ListOptions{LabelSelector: g.ticketSelector})
	if err != nil {
		return nil, fmt.Errorf("list ticket Leases %s/%s: %w", g.cfg.Namespace, g.ticketSelector, err)
	}
	queue := slices.DeleteFunc(list.Items, func(l coordinationv1.Lease) bool {
		_, granted := l.Annotations[GrantedAnnotation]
		return l.Name == skip || holder(&l) == "" || granted || l.Labels[LabelComponent] != LabelComponentTicket
	})
	slices.SortFunc(queue, queueOrder)
	return queue, nil
}

// handOut hands the slots free (each as read in leases: free, expired, or
// made free by the caller) to the queue, oldest ticket first but our own,
// and marks
// the oldest ticket left head. It returns how many it handed out. A slot
// written since it was read is skipped: someone else took it.
func (g *Gate) handOut(ctx context.Context, leases []*coordinationv1.Lease, free []int) int {
	queue, err := g.tickets(ctx, TicketName(g.cfg.Instance, g.cfg.Node))
	if err != nil {
		g.log.Warn("could not read the pull-slot queue; the head of the queue hands the slots out", "err", err)
		return 0
	}
	handed := 0
	for _, i := range free {
		if len(queue) == 0 {
			break
		}
		t := &queue[0]
		prev := leases[i]
		next := g.taken(prev, i, holder(t), g.now())
		write := g.update
		if prev == nil {
			write = g.create
		}
		if _, err := write(ctx, next); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
				g.log.Warn("could not hand a pull slot to the queue", "slot", next.Name, "ticket", t.Name, "err", err)
			}
			continue
		}
		g.markGranted(ctx, t, i)
		queue = queue[1:]
		handed++
	}
	g.markHead(ctx, queue)
	return handed
}

// markGranted tells ticket t's node that slot i names it.
func (g *Gate) markGranted(ctx context.Context, t *coordinationv1.Lease, i int) {
	g.annotate(ctx, t, GrantedAnnotation, strconv.Itoa(i))
}

// markHead makes the oldest ticket of queue the head, unless it is.
func (g *Gate) markHead(ctx context.Context, queue []coordinationv1.Lease) {
	if len(queue) == 0 || queue[0].Annotations[HeadAnnotation] == "true" {
		return
	}
	g.annotate(ctx, &queue[0], HeadAnnotation, "true")
}

// annotate sets key on ticket t if it still names the same holder. Failing
// costs time, not safety: a grant the node never hears of expires, and
// the head is marked again at the next hand-over.
func (g *Gate) annotate(ctx context.Context, t *coordinationv1.Lease, key, value string) {
	id := holder(t)
	_, err := g.rewrite(ctx, t.DeepCopy(), func(l *coordinationv1.Lease) (bool, error) {
		if holder(l) != id {
			return false, nil
		}
		l.Annotations = labels.Merge(l.Annotations, map[string]string{key: value})
		return true, nil
	})
	if err != nil && !apierrors.IsNotFound(err) {
		g.log.Warn("could not mark a pull-slot ticket", "ticket", t.Name, "mark", key, "err", err)
	}
}

// leaveQueue deletes our ticket once the wait is over, within
// Config.ReleaseGrace if it ended with ctx, and passes the head mark on if
// we had it.
func (g *Gate) leaveQueue(ctx context.Context, head bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ReleaseGrace)
	defer cancel()
	g.deleteTicket(ctx)
	if !head {
		return
	}
	queue, err := g.tickets(ctx, "")
	if err != nil {
		g.log.Warn("could not pass on the head of the pull-slot queue; the next hand-over does", "err", err)
		return
	}
	g.markHead(ctx, queue)
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
	leases := make([]*coordinationv1.Lease, g.cfg.Slots)
	leases[h.slot] = cleared
	free := []int{h.slot}
	if seeded {
		leases, free, err = g.vacant(ctx)
		if err != nil {
			g.log.Warn("could not read the pull slots to open them after seeding; the head of the queue does", "err", err)
			return nil
		}
	}
	g.handOut(ctx, leases, free)
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
		for i := range leases {
			if list.Items[j].Name == SlotName(g.cfg.Instance, i) {
				leases[i] = &list.Items[j]
			}
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
