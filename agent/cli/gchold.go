package cli

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/gcguard"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// The GC hold outlives the pod: the guard's history is written into every
// summary this agent writes (label.Summary.Removals), and read back by the
// next pod, fetch and watch alike, before anything is pulled.

// restoreAttempts and restoreBackoff bound reading the history back: a
// node that cannot be read costs at most one download of each image the
// hold would have kept, not the start of the pod.
const (
	restoreAttempts = 4
	restoreBackoff  = time.Second
)

// restoreGC takes up the history the last pod of this instance wrote on
// the node, for the images of the list.
func (a *agent) restoreGC(ctx context.Context) {
	if a.labeler == nil {
		return
	}
	var s label.Summary
	var ok bool
	var err error
	wait := restoreBackoff
	for i := range restoreAttempts {
		if _, s, ok, err = a.labeler.Current(ctx); err == nil || ctx.Err() != nil {
			break
		}
		if i < restoreAttempts-1 {
			if sleepCtx(ctx, wait) != nil {
				break
			}
			wait *= 2
		}
	}
	if err != nil {
		a.log.Warn("cannot read the node annotation: the holds on images the node's image GC keeps removing start afresh",
			"err", err)
		return
	}
	if !ok || len(s.Removals) == 0 || s.Owner != nil && a.labeler.Owner != nil && s.Owner.ID != a.labeler.Owner.ID {
		return
	}
	list := map[string]bool{}
	for _, e := range a.entries {
		list[e.Normalized] = true
	}
	recs := make([]gcguard.Record, 0, len(s.Removals))
	for _, r := range s.Removals {
		until, _ := time.Parse(time.RFC3339, r.Until)
		recs = append(recs, gcguard.Record{Image: r.Image, Removals: r.Removals, Holds: r.Holds, Until: until,
			Repulled: r.Repulled, Gone: r.Gone})
	}
	a.guard.Restore(recs, func(name string) bool { return list[name] })
	if n := a.guard.HeldCount(time.Now()); n > 0 {
		a.log.Info("holding back images the node's image GC keeps removing, as the last pod did", "images", n)
	}
}

// gcRemovals is the labeler's Removals: the guard's history, the entries
// that matter most first (held, then pulled back, then by removals), so
// that an annotation too large drops the least.
func (a *agent) gcRemovals() []label.Removal {
	now := time.Now()
	recs := a.guard.Records()
	rank := func(r gcguard.Record) int {
		switch {
		case now.Before(r.Until):
			return 0
		case r.Repulled:
			return 1
		}
		return 2
	}
	slices.SortFunc(recs, func(x, y gcguard.Record) int {
		return cmp.Or(cmp.Compare(rank(x), rank(y)), cmp.Compare(y.Removals, x.Removals), cmp.Compare(x.Image, y.Image))
	})
	out := make([]label.Removal, len(recs))
	for i, r := range recs {
		out[i] = label.Removal{Image: r.Image, Removals: r.Removals, Holds: r.Holds, Repulled: r.Repulled, Gone: r.Gone}
		if !r.Until.IsZero() {
			out[i].Until = r.Until.UTC().Format(time.RFC3339)
		}
	}
	return out
}

// holdGC is the puller's Hold, in fetch and watch alike: an image the node's
// image GC keeps removing is not pulled while its hold lasts. An image this
// agent saw present and now finds missing was removed: that removal counts
// here, before the watcher may report it.
func (a *agent) holdGC(r *pull.Result) bool {
	h, held := a.guard.Missing(r.Normalized, time.Now())
	if held {
		r.Reason, r.Message = pull.ReasonRemovedByGC, gcMessage(h)
	}
	return held
}

// gcSeen records what a run found: the images present, and those it pulled.
func (a *agent) gcSeen(results []pull.Result) {
	for _, r := range results {
		switch {
		case r.Pulled:
			a.guard.Pulled(r.Normalized)
		case r.Present:
			a.guard.Seen(r.Normalized)
		}
	}
}
