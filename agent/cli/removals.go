package cli

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/gcguard"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/presence"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// removals makes watch's label say `failed`, reason Removed, within seconds
// of an image leaving the node (agent/presence), and starts the repair: a
// check at once, which pulls the image again under herd control like any
// other. All its state is guarded by the agent's label lock, so that a
// check that looked before a removal never writes over the label that
// reported it.
type removals struct {
	a *agent
	// ctx is watch's: a label write ends with it.
	ctx     context.Context
	watcher *presence.Watcher
	// repair has a token when a check must run at once.
	repair chan struct{}
	// last is the last check's results and pins; gone, the images
	// reported gone since, with when.
	last []pull.Result
	pins *label.Pins
	gone map[string]time.Time
}

// watchRemovals starts watching the images each check finds present,
// until ctx ends. CRI-O has no event stream; the watcher then lists.
func watchRemovals(ctx context.Context, a *agent) *removals {
	r := &removals{a: a, ctx: ctx, repair: make(chan struct{}, 1), gone: map[string]time.Time{}}
	r.watcher = &presence.Watcher{Runtime: a.cri, Events: a.cri, Log: a.log, Gone: r.removed}
	go r.watcher.Run(ctx)
	return r
}

// wait sleeps for d, or until a removal asks for a check at once.
func (r *removals) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-r.repair:
	}
	return nil
}

// removed is the watcher's Gone.
func (r *removals) removed(imgs []presence.Image) {
	a := r.a
	a.labelMu.Lock()
	defer a.labelMu.Unlock()
	now := time.Now()
	for _, img := range imgs {
		r.gone[img.Name] = now
		// A runtime wiped while down is a one-off, not the kubelet's GC.
		if img.AfterRestart {
			a.guard.Wiped(img.Name)
			a.log.Warn("an image left the node; pulling it again", "image", img.Name)
			continue
		}
		if !a.guard.Removed(img.Name, now) {
			a.log.Warn("an image left the node; pulling it again", "image", img.Name)
			continue
		}
		h, _ := a.guard.Held(img.Name, now)
		msg := gcMessage(h)
		a.log.Warn("the node's image GC removed an image again after it was pulled back; not downloading it again for now", "image", img.Name, "until", h.Until)
		a.events.Emit(r.ctx, corev1.EventTypeWarning, pull.ReasonRemovedByGC, img.Name+": "+msg)
	}
	r.countHeld(now)
	if r.last != nil {
		s := r.summary()
		a.observe(s)
		if a.labeler != nil {
			a.reconcileLocked(r.ctx, s)
		}
	}
	select {
	case r.repair <- struct{}{}:
	default:
	}
}

// checked records a check's results, begun at start, and its pins, and
// writes the label they call for: an image reported gone after the check
// looked at it is Removed, whatever the check found, and a check follows
// at once.
func (r *removals) checked(ctx context.Context, results []pull.Result, start time.Time, pins *label.Pins) {
	a := r.a
	a.labelMu.Lock()
	defer a.labelMu.Unlock()
	r.last, r.pins = results, pins
	r.countHeld(time.Now())
	for name, at := range r.gone {
		if at.Before(start) {
			delete(r.gone, name)
		}
	}
	// An image reported gone after the check looked at it is not seen:
	// the repair's check, finding it missing, would count its removal
	// again.
	a.gcSeen(slices.DeleteFunc(slices.Clone(results), func(res pull.Result) bool {
		_, gone := r.gone[res.Normalized]
		return gone && !res.Pulled
	}))
	var set []presence.Image
	for _, res := range results {
		if _, gone := r.gone[res.Normalized]; res.Present && !gone {
			set = append(set, presence.Image{Name: res.Normalized, Ref: res.Ref, ID: res.ID})
		}
	}
	r.watcher.Watch(set)
	s := r.summary()
	s.DurationSeconds = float64(time.Since(start).Round(time.Millisecond)) / float64(time.Second)
	a.observe(s)
	if a.labeler != nil {
		a.reconcileLocked(ctx, s)
	}
}

// summary is the last results with the images gone since marked Removed.
func (r *removals) summary() label.Summary {
	rs := make([]pull.Result, len(r.last))
	copy(rs, r.last)
	now := time.Now()
	for i := range rs {
		at, gone := r.gone[rs[i].Normalized]
		if !gone {
			continue
		}
		rs[i].Present, rs[i].Reason = false, pull.ReasonRemoved
		rs[i].Message = fmt.Sprintf("left the node at %s (image GC, crictl rmi or a runtime wipe); being pulled again", at.UTC().Format(time.RFC3339))
		if h, held := r.a.guard.Held(rs[i].Normalized, now); held {
			rs[i].Reason, rs[i].Message = pull.ReasonRemovedByGC, gcMessage(h)
		}
	}
	s := pull.Summarize(rs, 0)
	s.SetPins(r.pins)
	s.Disk = r.a.diskState(r.ctx)
	return s
}

// gcMessage says why an image is not downloaded again, and what would
// keep it on the node.
func gcMessage(h gcguard.Hold) string {
	return fmt.Sprintf("the node's image GC keeps removing it (%d removals, the last after this agent pulled it back); not downloaded again before %s. "+
		"To keep it: pinning (containerd >= 1.7.10 or 2.x, within the pin budget), a larger pin budget, or the kubelet's image GC settings (imageMaximumGCAge, imageGCHighThresholdPercent)",
		h.Removals, h.Until.UTC().Format(time.RFC3339))
}

// countHeld sets the metric of the images held back.
func (r *removals) countHeld(now time.Time) {
	if r.a.metrics != nil {
		r.a.metrics.HeldByGC.Set(float64(r.a.guard.HeldCount(now)))
	}
}
