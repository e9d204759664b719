package slots

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Holding is one held slot, renewed in the background until Release.
type Holding struct {
	g           *Gate
	id          string
	slot        int
	seed        bool
	ctx         context.Context // Hold's: once it ends, Release has Config.ReleaseGrace
	stop        context.CancelFunc
	done        chan struct{}         // closed when the renew loop has ended
	lease       *coordinationv1.Lease // as last written; Release reads it once the loop has ended
	lost        chan struct{}
	wasLost     bool // set as lost is closed; Release reads it after done
	releaseOnce sync.Once
}

// newHolding starts renewing a Lease that was just written with us as
// holder; start is when the write was sent.
func (g *Gate) newHolding(held context.Context, lease *coordinationv1.Lease, slot int, id string, seed bool, start time.Time) *Holding {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Holding{g: g, id: id, slot: slot, seed: seed, ctx: held, stop: cancel,
		done: make(chan struct{}), lease: lease, lost: make(chan struct{})}
	go h.renewLoop(ctx, start)
	return h
}

// A holder renews every third of the lease duration, and is holder for
// two thirds of it after sending its last successful write; others take
// the slot a full duration after they saw it (the gap absorbs drift).
func (g *Gate) renewInterval() time.Duration { return g.cfg.LeaseDuration / 3 }
func (g *Gate) renewDeadline() time.Duration { return g.cfg.LeaseDuration * 2 / 3 }

// The slot's Lease name and index, our holderIdentity in it, whether we
// took it as a seed; Lost is closed when the slot is lost while held.
func (h *Holding) Name() string          { return SlotName(h.g.cfg.Instance, h.slot) }
func (h *Holding) Slot() int             { return h.slot }
func (h *Holding) Identity() string      { return h.id }
func (h *Holding) Seed() bool            { return h.seed }
func (h *Holding) Lost() <-chan struct{} { return h.lost }

// renewLoop renews until stopped; a renewal not written by the deadline
// (the apiserver is down, the Lease was taken or deleted) loses the slot.
func (h *Holding) renewLoop(ctx context.Context, lastGood time.Time) {
	defer close(h.done)
	g := h.g
	for sleep(ctx, lastGood.Add(g.renewInterval()).Sub(g.now())) {
		start := g.now()
		rctx, cancel := context.WithDeadline(ctx, lastGood.Add(g.renewDeadline()))
		// After a conflict (a seed marking slot 0), the new version is
		// written if it still names us.
		updated, err := g.rewrite(rctx, h.lease, func(l *coordinationv1.Lease) (bool, error) {
			if holder(l) != h.id {
				return false, fmt.Errorf("the Lease names another holder: %q", holder(l))
			}
			t := metav1.NewMicroTime(start)
			l.Spec.RenewTime = &t
			return true, nil
		})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			h.wasLost = true
			close(h.lost)
			g.log.Error("lost pull slot; this node no longer counts as a holder and stops pulling until it holds one again",
				"slot", h.Name(), "holder", h.id, "lastRenewal", lastGood.Format(time.RFC3339Nano), "err", err)
			return
		}
		h.lease, lastGood = updated, start
	}
}

// Release gives the slot back: the holder is cleared, and a seed whose
// pull ended records on the slot that it has finished (one whose slot was
// lost or whose run was terminated has not). Once Hold's context has ended, it
// takes at most Config.ReleaseGrace, even if it began before. Failures are
// logged: the slot frees itself after the lease duration. It may be called
// more than once.
func (h *Holding) Release() {
	h.releaseOnce.Do(func() {
		h.stop()
		<-h.done
		g := h.g
		ctx, cancel := context.WithTimeout(context.Background(), 3*g.cfg.CallTimeout)
		defer cancel()
		defer context.AfterFunc(h.ctx, func() { time.AfterFunc(g.cfg.ReleaseGrace, cancel) })()
		// A seed whose pull ended records it on its slot in the release.
		seeded := h.seed && !h.wasLost && h.ctx.Err() == nil
		if h.seed && !seeded {
			g.log.Warn("this seed node's pull was cut short; not recording that seeding finished", "slot", h.Name(), "lost", h.wasLost)
		}
		if err := h.clear(ctx, seeded); err != nil {
			g.log.Error("could not release pull slot; it frees itself after the lease duration",
				"slot", h.Name(), "leaseDuration", g.cfg.LeaseDuration.String(), "seeded", seeded, "err", err)
			return
		}
		g.log.Info("released pull slot", "slot", h.Name(), "seeded", seeded)
	})
}

// clear empties holderIdentity if we still hold it, and keeps the Lease;
// seeded sets SeededAnnotation to Config.SeedKey.
func (h *Holding) clear(ctx context.Context, seeded bool) error {
	_, err := h.g.rewrite(ctx, h.lease, func(l *coordinationv1.Lease) (bool, error) {
		if holder(l) != h.id {
			return false, nil // taken after it expired: nothing of ours to clear
		}
		if seeded {
			l.Annotations = labels.Merge(l.Annotations, map[string]string{SeededAnnotation: h.g.cfg.SeedKey})
		}
		now := metav1.NewMicroTime(h.g.now())
		l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil, &now
		return true, nil
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// rewrite writes change applied to a copy of cur (read first when it has
// no resourceVersion), if change says to. A conflict reads the Lease again;
// other failures are tried again after a pause until ctx ends.
func (g *Gate) rewrite(ctx context.Context, cur *coordinationv1.Lease, change func(*coordinationv1.Lease) (bool, error)) (*coordinationv1.Lease, error) {
	name, pause := cur.Name, minRetry/2 // doubling
	for {
		var err error
		if cur.ResourceVersion == "" {
			cur, err = g.get(ctx, name)
		}
		if err == nil {
			next := cur.DeepCopy()
			write, cerr := change(next)
			if cerr != nil || !write {
				return cur, cerr
			}
			if next, err = g.update(ctx, next); err == nil {
				return next, nil
			}
		}
		cur = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
		switch {
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err), ctx.Err() != nil:
			return nil, fmt.Errorf("Lease %s/%s: %w", g.cfg.Namespace, name, err)
		}
		g.log.Warn("writing a pull slot failed; will retry", "slot", name, "retryIn", pause.String(), "err", err)
		if !sleep(ctx, pause) {
			return nil, fmt.Errorf("Lease %s/%s: %w", g.cfg.Namespace, name, err)
		}
		pause = min(2*pause, maxRetry)
	}
}

// sleep waits for d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return ctx.Err() == nil
	}
}
