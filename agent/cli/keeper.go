package cli

import (
	"context"
	"sync"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// keeper keeps the label truthful while a check is stuck, typically waiting
// for a herd-control slot to pull a garbage-collected image again, which
// can take hours during a rollout with a small maxConcurrentNodes. Each
// check reports what the ImageStatus pass found before it asks for a slot;
// if the check is still pulling or waiting a refresh interval later, the
// label is made to say that: failed, with the missing images as Missing.
// A deleted label or a re-created Node is repaired the same way, at the
// keeper's ticks (every interval, jittered). A re-pull that ends within
// one interval never flips the label.
type keeper struct {
	a *agent
	// wake tells the keeper that a check began waiting: it looks again
	// one interval later, not at its next tick after that.
	wake chan struct{}

	mu       sync.Mutex
	checking bool
	pending  *label.Summary // the current check's state before its pulls
	since    time.Time      // when pending was set
}

func newKeeper(a *agent) *keeper { return &keeper{a: a, wake: make(chan struct{}, 1)} }

func (k *keeper) begin() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.checking, k.pending = true, nil
}

func (k *keeper) end() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.checking, k.pending = false, nil
}

// waiting is the puller's Waiting hook; results are only read here.
func (k *keeper) waiting(results []pull.Result) {
	s := pendingSummary(results)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.checking {
		k.pending, k.since = &s, time.Now()
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

// pendingSummary is the state before pulling: every image not present is
// Missing, being pulled.
func pendingSummary(results []pull.Result) label.Summary {
	rs := make([]pull.Result, len(results))
	copy(rs, results)
	for i := range rs {
		if !rs[i].Present && rs[i].Reason == "" {
			rs[i].Reason = pull.ReasonMissing
			rs[i].Message = "not present on the node; being pulled, or waiting for a pull slot"
		}
	}
	return pull.Summarize(rs, 0)
}

func (k *keeper) repairWhileChecking(ctx context.Context, refresh time.Duration) {
	a := k.a
	for a.labeler != nil {
		wait := jitter(refresh)
		k.mu.Lock()
		if due := time.Until(k.since.Add(refresh)); k.pending != nil && due > 0 {
			wait = min(wait, due)
		}
		k.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-k.wake:
			t.Stop()
			continue
		case <-t.C:
		}
		// pending is read under the label lock: a check whose pulls ended
		// has cleared it by then, so its own, newer rewrite is never
		// overwritten with this older state.
		a.labelMu.Lock()
		k.mu.Lock()
		s := k.pending
		// A re-pull that ends within one interval never flips the label.
		if time.Since(k.since) < refresh {
			s = nil
		}
		k.mu.Unlock()
		if s != nil {
			a.log.Debug("a check is still pulling or waiting for a pull slot; making the label tell what is missing")
			a.reconcileLocked(ctx, *s)
		}
		a.labelMu.Unlock()
	}
}
