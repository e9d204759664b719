package slots

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// errNotHolder means the Lease says someone else holds the slot now.
var errNotHolder = errors.New("the Lease has another holder")

// Holding is one held slot. It renews the Lease in the background until
// Release. If renewing fails for two thirds of the lease duration it stops
// counting itself as the holder (Held turns false, Lost is closed, the
// reason is logged), because by the time the full duration has passed
// another node may take the slot.
type Holding struct {
	g    *Gate
	id   string
	slot int
	seed bool

	stop context.CancelFunc
	done chan struct{} // closed when the renew loop has ended

	mu         sync.Mutex
	lease      *coordinationv1.Lease // as last written by us
	validUntil time.Time             // when we stop counting ourselves as holder
	lost       chan struct{}
	lostErr    error
	released   bool

	releaseOnce sync.Once
}

// newHolding starts renewing a Lease that was just written with us as
// holder; start is when the write was sent.
func (g *Gate) newHolding(lease *coordinationv1.Lease, slot int, id string, seed bool, start time.Time) *Holding {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Holding{
		g: g, id: id, slot: slot, seed: seed,
		stop: cancel, done: make(chan struct{}),
		lease: lease, validUntil: start.Add(g.renewDeadline()),
		lost: make(chan struct{}),
	}
	go h.renewLoop(ctx, start)
	return h
}

// renewInterval is how often a holder renews.
func (g *Gate) renewInterval() time.Duration { return g.cfg.LeaseDuration / 3 }

// renewDeadline is how long after the start of its last successful write a
// holder still counts itself as holder. Others may take the slot only a
// full lease duration after they saw that write, which is later; the gap
// absorbs clock-rate differences and a slow final write.
func (g *Gate) renewDeadline() time.Duration { return g.cfg.LeaseDuration * 2 / 3 }

// Name is the slot's Lease name.
func (h *Holding) Name() string { return SlotName(h.g.cfg.Instance, h.slot) }

// Slot is the slot's index, 0 .. K-1.
func (h *Holding) Slot() int { return h.slot }

// Identity is the holderIdentity written to the Lease.
func (h *Holding) Identity() string { return h.id }

// Seed reports whether this node took its slot as a seed.
func (h *Holding) Seed() bool { return h.seed }

// Held reports whether we still count ourselves as the slot's holder. It
// is judged by the clock, not by the renew loop having noticed, so it is
// false from the renew deadline on even if that goroutine is starved.
func (h *Holding) Held() bool {
	now := h.g.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.released && h.lostErr == nil && now.Before(h.validUntil)
}

// Lost is closed when the slot is lost while held (not on Release).
func (h *Holding) Lost() <-chan struct{} { return h.lost }

// Err says why the slot was lost, or nil.
func (h *Holding) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostErr
}

func (h *Holding) renewLoop(ctx context.Context, lastGood time.Time) {
	defer close(h.done)
	g := h.g
	for {
		if !sleep(ctx, lastGood.Add(g.renewInterval()).Sub(g.now())) {
			return
		}
		deadline := lastGood.Add(g.renewDeadline())
		for {
			start := g.now()
			if !start.Before(deadline) {
				h.markLost(fmt.Errorf("no successful renewal since %s", lastGood.Format(time.RFC3339Nano)))
				return
			}
			err := h.renewOnce(ctx, start, deadline)
			if err == nil {
				lastGood = start
				break
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errNotHolder) {
				h.markLost(err)
				return
			}
			g.log.Warn("renewing pull slot failed; will retry", "slot", h.Name(), "err", err)
			if !sleep(ctx, min(g.renewInterval()/4, deadline.Sub(g.now()))) {
				return
			}
		}
	}
}

// renewOnce writes a new renewTime. On a conflict (someone changed the
// Lease, for example a seed marking slot 0) it rereads the Lease and, if
// we still hold it, renews on top of the new version.
func (h *Holding) renewOnce(ctx context.Context, start, deadline time.Time) error {
	g := h.g
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	h.mu.Lock()
	cur := h.lease.DeepCopy()
	h.mu.Unlock()
	for attempt := 0; ; attempt++ {
		next := cur.DeepCopy()
		t := metav1.NewMicroTime(start)
		secs := int32(g.cfg.LeaseDuration / time.Second)
		next.Spec.RenewTime = &t
		next.Spec.LeaseDurationSeconds = &secs
		updated, err := g.update(ctx, next)
		if err == nil {
			h.mu.Lock()
			h.lease = updated
			h.validUntil = start.Add(g.renewDeadline())
			h.mu.Unlock()
			return nil
		}
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: Lease %s was deleted", errNotHolder, h.Name())
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			return fmt.Errorf("update Lease %s: %w", h.Name(), err)
		}
		cur, err = g.get(ctx, h.Name())
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: Lease %s was deleted", errNotHolder, h.Name())
		}
		if err != nil {
			return fmt.Errorf("get Lease %s: %w", h.Name(), err)
		}
		if holder(cur) != h.id {
			return fmt.Errorf("%w: Lease %s is held by %q", errNotHolder, h.Name(), holder(cur))
		}
	}
}

func (h *Holding) markLost(err error) {
	h.mu.Lock()
	if h.lostErr != nil || h.released {
		h.mu.Unlock()
		return
	}
	h.lostErr = err
	close(h.lost)
	h.mu.Unlock()
	h.g.log.Error("lost pull slot; this node no longer counts as a holder, so the cluster-wide cap may be exceeded until its pull ends",
		"slot", h.Name(), "holder", h.id, "err", err)
}

// Release gives the slot back: a seed first records that it has finished,
// then the holder field is cleared so that a waiter can take the slot at
// once. It uses its own timeouts, not the caller's context, because it
// usually runs when that context is done. Failures are logged; the slot
// then frees itself after the lease duration. Release may be called more
// than once.
func (h *Holding) Release() {
	h.releaseOnce.Do(func() {
		h.stop()
		<-h.done
		h.mu.Lock()
		h.released = true
		h.mu.Unlock()
		g := h.g
		ctx, cancel := context.WithTimeout(context.Background(), 3*g.cfg.CallTimeout)
		defer cancel()
		if h.seed {
			if err := g.markSeeded(ctx); err != nil {
				g.log.Error("could not record that this seed node finished; other nodes wait for another seed",
					"slot", SlotName(g.cfg.Instance, 0), "err", err)
			} else {
				g.log.Info("recorded that a seed node finished", "slot", SlotName(g.cfg.Instance, 0))
			}
		}
		if err := h.clear(ctx); err != nil {
			g.log.Error("could not release pull slot; it frees itself after the lease duration",
				"slot", h.Name(), "leaseDuration", g.cfg.LeaseDuration.String(), "err", err)
			return
		}
		g.log.Info("released pull slot", "slot", h.Name())
	})
}

// clear empties holderIdentity if we are still the holder. It keeps the
// Lease (and its annotations) rather than deleting it.
func (h *Holding) clear(ctx context.Context) error {
	g := h.g
	h.mu.Lock()
	cur := h.lease.DeepCopy()
	h.mu.Unlock()
	var err error
	for {
		if holder(cur) != h.id {
			return nil // someone took it after it expired; nothing of ours to clear
		}
		next := cur.DeepCopy()
		now := metav1.NewMicroTime(g.now())
		next.Spec.HolderIdentity = nil
		next.Spec.AcquireTime = nil
		next.Spec.RenewTime = &now
		_, err = g.update(ctx, next)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
		default:
			g.log.Warn("releasing pull slot failed; will retry", "slot", h.Name(), "err", err)
			if !sleep(ctx, g.cfg.PollInterval/4) {
				return fmt.Errorf("update Lease %s: %w", h.Name(), err)
			}
		}
		cur, err = g.get(ctx, h.Name())
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			if !sleep(ctx, g.cfg.PollInterval/4) {
				return fmt.Errorf("get Lease %s: %w", h.Name(), err)
			}
			h.mu.Lock()
			cur = h.lease.DeepCopy()
			h.mu.Unlock()
		}
	}
}

// markSeeded sets SeededAnnotation on slot 0, creating that Lease without
// a holder if it does not exist yet.
func (g *Gate) markSeeded(ctx context.Context) error {
	name := SlotName(g.cfg.Instance, 0)
	value := g.seedValue()
	for {
		lease, err := g.get(ctx, name)
		switch {
		case apierrors.IsNotFound(err):
			secs := int32(g.cfg.LeaseDuration / time.Second)
			fresh := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{
					Name: name, Namespace: g.cfg.Namespace, Labels: g.labels(0),
					Annotations: map[string]string{SeededAnnotation: value},
				},
				Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &secs},
			}
			_, err = g.create(ctx, fresh)
		case err == nil:
			if seededBy(lease, value) {
				return nil
			}
			next := lease.DeepCopy()
			if next.Annotations == nil {
				next.Annotations = map[string]string{}
			}
			next.Annotations[SeededAnnotation] = value
			_, err = g.update(ctx, next)
		}
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
			continue // someone else wrote slot 0; read it again
		}
		if !sleep(ctx, g.cfg.PollInterval/4) {
			return fmt.Errorf("mark Lease %s seeded: %w", name, err)
		}
	}
}

// sleep waits for d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
