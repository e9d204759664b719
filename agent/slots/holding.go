package slots

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Holding is one held slot, renewed in the background until Release.
type Holding struct {
	g    *Gate
	id   string
	slot int
	seed bool
	// ctx is Hold's: once it ends, Release has Config.ReleaseGrace.
	ctx  context.Context
	stop context.CancelFunc
	// done is closed when the renew loop has ended.
	done chan struct{}
	// lease is as last written; Release reads it once the loop has ended.
	lease *coordinationv1.Lease
	// unsure are the takes of other slots whose answer never came, cleared
	// by the renew loop if they land (disownUnsure).
	unsure []take
	lost   chan struct{}
	// wasLost is set as lost is closed; Release reads it after done.
	wasLost     bool
	releaseOnce sync.Once
	// janitor is set on the holders of the first slots (janitor.go).
	janitor *janitor
}

// newHolding starts renewing a Lease that was just written with us as
// holder; start is when the write was sent.
func (g *Gate) newHolding(held context.Context, lease *coordinationv1.Lease, slot int, id string, seed bool,
	start time.Time, unsure []take) *Holding {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Holding{
		g:      g,
		id:     id,
		slot:   slot,
		seed:   seed,
		ctx:    held,
		stop:   cancel,
		done:   make(chan struct{}),
		lease:  lease,
		unsure: unsure,
		lost:   make(chan struct{}),
	}
	if slot < janitors {
		h.janitor = &janitor{}
	}
	go h.renewLoop(ctx, start)
	return h
}

// A holder renews every third of the lease duration, and is holder for
// two thirds of it after sending its last successful write; others take
// the slot a full duration after they saw it (the gap absorbs drift).
func (g *Gate) renewInterval() time.Duration {
	return g.cfg.LeaseDuration / 3
}

func (g *Gate) renewDeadline() time.Duration {
	return g.cfg.LeaseDuration * 2 / 3
}

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
	if h.janitor != nil {
		// Beside the renewals, so that handing slots out never delays one.
		jctx, stop := context.WithCancel(ctx)
		looked := make(chan struct{})
		go func() {
			defer close(looked)
			h.lookAfterSlots(jctx)
		}()
		defer func() {
			stop()
			<-looked
		}()
	}
	h.disownUnsure(ctx)
	for {
		if !sleep(ctx, lastGood.Add(g.renewInterval()).Sub(g.now())) {
			return
		}
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
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			h.wasLost = true
			close(h.lost)
			g.log.Error("lost pull slot; this node no longer counts as a holder and stops pulling until it holds one again",
				"slot", h.Name(), "holder", h.id, "lastRenewal", lastGood.Format(time.RFC3339Nano), "err", err)
			return
		}
		h.lease = updated
		lastGood = start
		h.disownUnsure(ctx)
	}
}

// unsureFor is how long after it was sent a take's write whose answer
// never came is watched for: the apiserver may still make a write after
// the caller gave up on it, but not for long.
func (g *Gate) unsureFor() time.Duration {
	return 2 * g.cfg.CallTimeout
}

// disownUnsure clears the slots that takes of ours, whose answer never
// came, wrote after all: nobody renews them. It looks at each once more
// at every renewal until unsureFor has passed since its write.
func (h *Holding) disownUnsure(ctx context.Context) {
	g := h.g
	h.unsure = slices.DeleteFunc(h.unsure, func(t take) bool {
		name := SlotName(g.cfg.Instance, t.slot)
		cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := g.disown(ctx, cur, t.id); err != nil {
			g.log.Warn("could not clear a pull slot an unanswered take may have written; will look again",
				"slot", name, "holder", t.id, "err", err)
			return false
		}
		return g.now().Sub(t.sent) > g.unsureFor()
	})
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
		// Once Hold's context ends (SIGTERM), what is left gets the grace.
		graceOnEnd := func() { time.AfterFunc(g.cfg.ReleaseGrace, cancel) }
		stopGrace := context.AfterFunc(h.ctx, graceOnEnd)
		defer stopGrace()
		// A seed whose pull ended records it on its slot in the release.
		seeded := h.seed && !h.wasLost && h.ctx.Err() == nil
		if h.seed && !seeded {
			g.log.Warn("this seed node's pull was cut short; not recording that seeding finished",
				"slot", h.Name(), "lost", h.wasLost)
		}
		err := h.release(ctx, seeded)
		if err != nil && h.wasLost && h.ctx.Err() == nil {
			g.log.Warn("could not release the lost pull slot; giving it back once the API answers",
				"slot", h.Name(), "err", err)
			go h.giveBack()
			return
		}
		if err != nil {
			g.log.Error("could not release pull slot; it frees itself after the lease duration",
				"slot", h.Name(), "leaseDuration", g.cfg.LeaseDuration.String(), "seeded", seeded, "err", err)
		}
	})
}

// giveBack releases a slot lost to an outage once the API answers, trying
// every renewal interval until Hold's context ends. Otherwise it names us
// until a node that can see it judges it expired, a lease duration after
// the apiserver's return at best (waiters back off up to 30 s first), and
// after an outage every holder's slot is such a one. Clearing it is safe
// at any time: the write carries the version read, and only a Lease that
// still names us is cleared.
func (h *Holding) giveBack() {
	g := h.g
	for sleep(h.ctx, g.renewInterval()) {
		ctx, cancel := context.WithTimeout(h.ctx, g.cfg.CallTimeout)
		err := h.release(ctx, false)
		cancel()
		if err == nil {
			return
		}
	}
}

// clear empties holderIdentity if we still hold it, and keeps the Lease;
// seeded sets SeededAnnotation to Config.SeedKey. It returns the Lease as
// cleared, nil if it was not ours.
func (h *Holding) clear(ctx context.Context, seeded bool) (*coordinationv1.Lease, error) {
	ours := true
	cleared, err := h.g.rewrite(ctx, h.lease, func(l *coordinationv1.Lease) (bool, error) {
		if holder(l) != h.id {
			ours = false
			return false, nil // taken after it expired: nothing of ours to clear
		}
		if seeded {
			l.Annotations = labels.Merge(l.Annotations, map[string]string{SeededAnnotation: h.g.cfg.SeedKey})
		}
		h.g.vacate(l)
		return true, nil
	})
	if apierrors.IsNotFound(err) || !ours {
		return nil, nil
	}
	return cleared, err
}

// disown clears the Lease cur (read first if it has no resourceVersion)
// if it names id: a take of ours whose outcome we did not know, which no
// one renews.
func (g *Gate) disown(ctx context.Context, cur *coordinationv1.Lease, id string) error {
	// rewrite retries until its context ends: a call's time, so that a
	// renewal waiting on this one is not held up.
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	_, err := g.rewrite(ctx, cur, func(l *coordinationv1.Lease) (bool, error) {
		if holder(l) != id {
			return false, nil
		}
		g.log.Info("clearing a pull slot that a take whose answer never came wrote", "slot", l.Name, "holder", id)
		g.vacate(l)
		return true, nil
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// vacate makes l a free slot.
func (g *Gate) vacate(l *coordinationv1.Lease) {
	now := metav1.NewMicroTime(g.now())
	l.Spec.HolderIdentity = nil
	l.Spec.AcquireTime = nil
	l.Spec.RenewTime = &now
}

// rewrite writes change applied to a copy of cur (read first when it has
// no resourceVersion), if change says to. A conflict reads the Lease again;
// other failures are tried again after a pause until ctx ends.
func (g *Gate) rewrite(ctx context.Context, cur *coordinationv1.Lease,
	change func(*coordinationv1.Lease) (bool, error)) (*coordinationv1.Lease, error) {
	name := cur.Name
	pause := minRetry / 2 // doubling
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
			next, err = g.update(ctx, next)
			if err == nil {
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
