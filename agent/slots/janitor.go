package slots

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Looking after the slots. Waiters see no heartbeat, so none of them can
// tell a dead holder from a live one in time: a holder whose node died,
// or a slot handed to a ticket whose node has gone, would stay idle. The
// holders of the first janitors slots tell instead. They are alive (they
// renew every few seconds), and they stay long enough to judge: a pull of
// a real set takes longer than a lease duration. Every renewal interval
// they list the slots, and hand to the queue (handOut) a slot seen unchanged
// for its lease duration on their own clock, or free and unchanged since
// their last look (no hand-over reached the queue). Two, so that one whose
// node died is seen by the other. A waiter alone in the queue looks at
// the slots itself (waiter.alone), which covers K = 1.
//
// A queue of waiting nodes that would look instead turns over with every
// hand-over: at K = 100 the oldest ticket, which would look, is handed a
// slot within a second, long before it could judge any expiry.
const janitors = 2

// janitor is what a holder of one of the first slots has seen of them.
type janitor struct {
	leases []*coordinationv1.Lease
	// since is when each version was first seen, on our clock.
	since []time.Time
}

// lookAfterSlots looks at the slots every renewal interval until ctx
// ends (the slot is released or lost).
func (h *Holding) lookAfterSlots(ctx context.Context) {
	for {
		h.lookAfter(ctx)
		if !sleep(ctx, h.g.renewInterval()) {
			return
		}
	}
}

// lookAfter lists the slots and hands the idle ones to the queue. Errors
// are logged: the next look tries again.
func (h *Holding) lookAfter(ctx context.Context) {
	g := h.g
	j := h.janitor
	lctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	list, err := g.cfg.Client.List(lctx, metav1.ListOptions{LabelSelector: g.selector})
	cancel()
	if err != nil {
		g.log.Warn("could not list the pull slots to look after them; will look again",
			"err", err)
		return
	}
	now := g.now()
	leases := make([]*coordinationv1.Lease, g.cfg.Slots)
	since := make([]time.Time, g.cfg.Slots)
	seeded := g.cfg.SeedNodes == 0
	for k := range list.Items {
		l := &list.Items[k]
		i := g.slotIndex(l.Name)
		if i < 0 {
			continue
		}
		leases[i] = l
		since[i] = now
		if j.leases != nil && j.leases[i] != nil && j.leases[i].ResourceVersion == l.ResourceVersion {
			since[i] = j.since[i]
		}
		seeded = seeded || l.Annotations[SeededAnnotation] == g.cfg.SeedKey
	}
	first := j.leases == nil
	j.leases = leases
	j.since = since
	if first {
		return // nothing judged yet: every version was seen just now
	}
	eligible := g.cfg.Slots
	if !seeded {
		eligible = min(g.cfg.SeedNodes, g.cfg.Slots)
	}
	var idle []int
	for i, l := range leases[:eligible] {
		if i == h.slot || l == nil || since[i].Equal(now) {
			continue // ours, not made yet, or changed since the last look
		}
		switch {
		case holder(l) == "":
			// Quietly: at the end of a rollout, slots stay free with no one waiting.
			idle = append(idle, i)
		case now.Sub(since[i]) >= g.duration(l):
			g.log.Info("handing an expired pull slot to the queue", "slot", l.Name, "previousHolder", holder(l),
				"unchangedFor", now.Sub(since[i]).Round(time.Millisecond).String())
			idle = append(idle, i)
		}
	}
	if len(idle) == 0 {
		return
	}
	g.handOut(ctx, leases, idle, "", seeded)
}
