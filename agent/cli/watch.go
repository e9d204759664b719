package cli

import (
	"context"
	"errors"
	"math/rand/v2"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/image-prefetcher/image-prefetcher/agent/coverage"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

func newWatch(deps *Deps) *cobra.Command {
	f := &agentFlags{}
	var refresh time.Duration
	var removeOnExit bool
	var removeBudget time.Duration
	cmd := &cobra.Command{
		Use:   "watch [flags] [IMAGE...]",
		Short: "Keep the images present and the node label truthful until SIGTERM (the main container)",
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			stoppedAt := doneAt(ctx)
			f.parsed(cmd)
			a := newAgent(f, deps)
			kp := newKeeper(a)
			a.onWaiting, a.afterPull = kp.waiting, kp.end
			// The label must be settled within removeBudget of the signal,
			// however long the loop takes to notice it.
			exit := func() error {
				if !removeOnExit {
					return nil
				}
				return a.settleKey(ctx, stoppedAt().Add(removeBudget))
			}
			if err := a.init(ctx, args); err != nil {
				var ce *ExitCodeError
				if ctx.Err() == nil || errors.As(err, &ce) && (ce.Code == ExitUsage || ce.Code == ExitInstanceMoved) {
					return err
				}
				// SIGTERM while starting up, typically while waiting for
				// the runtime: the pod is going away, which is no failure.
				a.log.Info("terminating during start-up", "interrupted", err)
				return exit()
			}
			defer a.cri.Close()
			defer a.watchTaint(ctx)()
			deps.Ready()
			if refresh > 0 {
				a.log.Info("watching", "images", len(a.entries), "refreshInterval", refresh)
				go kp.repairWhileChecking(ctx, refresh)
				a.removals = watchRemovals(ctx, a)
				for {
					kp.begin()
					a.check(ctx)
					if a.removals.wait(ctx, jitter(refresh)) != nil {
						break
					}
				}
			} else {
				a.log.Info("periodic checks disabled (--refresh-interval=0); waiting for SIGTERM")
				<-ctx.Done()
			}
			a.log.Info("terminating")
			return exit()
		},
	}
	f.register(cmd, deps)
	cmd.Flags().DurationVar(&refresh, "refresh-interval", 10*time.Minute, "how often images and the label are checked (±10% jitter); 0 disables the checks")
	cmd.Flags().BoolVar(&removeOnExit, "remove-label-on-exit", true, "remove this instance's node label and annotation on SIGTERM")
	// 4s from the signal keeps the whole shutdown inside the 5s the issue
	// allows, even with the API server hung: a rewrite in flight is
	// abandoned at once, and nothing else left to do takes long.
	cmd.Flags().DurationVar(&removeBudget, "remove-label-timeout", 4*time.Second, "how long after SIGTERM removing the label may take")
	_ = cmd.Flags().MarkHidden("remove-label-timeout")
	return cmd
}

// doneAt returns a function that tells when ctx ended. The time is taken
// when ctx ends, in the background, or at the latest when asked.
func doneAt(ctx context.Context) func() time.Time {
	var once sync.Once
	var at time.Time
	mark := func() { once.Do(func() { at = time.Now() }) }
	context.AfterFunc(ctx, mark)
	return func() time.Time {
		mark()
		return at
	}
}

// coverageShare is the part of the shutdown budget that asking whether the
// instance still covers the node may take; writing the key gets the rest.
const coverageShare = 3 * time.Second / 2

// ReasonListChanged is the reason, in the annotation, of a key marked
// failed because the DaemonSet's current template carries another list.
const ReasonListChanged = "ListChanged"

// settleKey decides what becomes of the node key when the pod terminates,
// by what its DaemonSet does next (coverage.Checker):
//
//   - the DaemonSet still runs a pod on this node with the same list (a
//     rollout that changed something else, a pod restart): the key stays;
//     the images stay, and the next pod's fetch rewrites it;
//   - it runs one with another list: the key says failed, naming the
//     change, so that a list change is never hidden behind the old list's
//     succeeded, even when the next pod never starts (its image cannot be
//     pulled, say);
//   - it no longer covers the node (deleted, being deleted, not selecting
//     the node, or the node's NoExecute taint evicts the pod), or that
//     cannot be told (outside a pod, no access, API down): the key goes,
//     so that it never outlives its instance.
//
// The pins follow the same rules, also without a key (--label-node=false):
// nothing else removes an uninstalled instance's pins.
func (a *agent) settleKey(ctx context.Context, deadline time.Time) error {
	if a.labeler == nil && a.pinner == nil {
		return nil
	}
	until := time.Now().Add(coverageShare)
	if deadline.Before(until) {
		until = deadline
	}
	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	c := coverage.Checker{Client: a.kube, Namespace: a.namespace, Pod: a.pod, Node: a.flags.nodeName, List: a.digest}
	verdict, why, err := c.Check(cctx)
	cancel()
	switch {
	case err != nil:
		a.log.Warn("cannot tell whether the instance still covers this node; removing its label and pins", "err", err)
	case verdict == coverage.Kept:
		a.log.Info("keeping the node label and the pins: the instance still covers this node with the same image list", "why", why)
		return nil
	case verdict == coverage.ListChanged && a.labeler == nil:
		// The next pod's first check makes the pins follow its list.
		return nil
	case verdict == coverage.ListChanged:
		return a.markListChanged(ctx, deadline, why)
	default:
		a.log.Info("the instance no longer covers this node; removing its label and pins", "why", why)
	}
	// The pins go with the label, after it: the label is what the
	// shutdown budget is for.
	defer a.unpinAll(ctx, deadline)
	return a.removeLabel(ctx, deadline)
}

// markListChanged makes the key say failed: the node holds this pod's list,
// not the one the DaemonSet now carries. ctx is the command's context,
// already done.
func (a *agent) markListChanged(ctx context.Context, deadline time.Time, why string) error {
	a.log.Warn("the DaemonSet's current pod template carries another image list: the node label says failed until the next pod has checked it", "why", why)
	a.labelMu.Lock()
	var s label.Summary
	if a.written != nil {
		s = *a.written
	}
	a.labelMu.Unlock()
	failed := append(slices.Clone(s.Failed), label.Failure{Image: "image list", Reason: ReasonListChanged, Message: why + "; the next pod of the DaemonSet checks the new list"})
	marked := label.NewSummary(s.Total, s.Present, failed, 0, time.Now())
	marked.SetPins(s.Pins)
	// The Event goes with the label: without it, status --hits would count
	// a pod's pull just before the new list's fetch as a miss under the
	// old list's succeeded (issue 38, finding 7).
	return a.writeOnExit(ctx, deadline, "marking", "marked failed", func(ctx context.Context) error {
		if err := a.labeler.Apply(ctx, marked); err != nil {
			return err
		}
		a.events.Record(ctx, false, marked.Text())
		return nil
	})
}

// removeLabel removes this instance's label and annotation, giving up at
// deadline. ctx is the command's context, already done: only its values
// are kept.
func (a *agent) removeLabel(ctx context.Context, deadline time.Time) error {
	if a.labeler == nil {
		return nil
	}
	return a.writeOnExit(ctx, deadline, "removing", "removed", func(ctx context.Context) error { return a.labeler.Remove(ctx, time.Until(deadline)) })
}

// writeOnExit runs write, a change of the key while terminating, until
// deadline; doing and done ("removing", "removed") name it in the log. A
// key that belongs to another instance is left alone, which is no failure.
func (a *agent) writeOnExit(ctx context.Context, deadline time.Time, doing, done string, write func(context.Context) error) error {
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	if err := write(wctx); err != nil {
		if label.IsOwnerConflict(err) {
			a.log.Info("not "+doing+" the node label: it belongs to another instance of the same name", "err", err)
			return nil
		}
		a.log.Error(doing+" the node label failed", "err", err)
		return &ExitCodeError{Code: ExitError, Err: errSilent}
	}
	a.log.Info("node label "+done, "key", a.labeler.Key)
	return nil
}

func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}

// check makes sure every image is still there, re-pulls what image garbage
// collection removed, and rewrites the label only when it drifted from the
// truth. A check interrupted by SIGTERM writes nothing.
func (a *agent) check(ctx context.Context) {
	start := time.Now()
	results := a.puller.Run(ctx, a.entries, v1alpha1.PullIfNotPresent)
	if a.afterPull != nil {
		a.afterPull()
	}
	if ctx.Err() != nil {
		return
	}
	for _, r := range results {
		if r.Pulled {
			a.log.Info("image was missing and has been pulled again", "image", r.Normalized)
		}
	}
	a.removals.checked(ctx, results, start, a.syncPins(ctx, results))
	a.taintDone(results)
}

// reconcileLocked rewrites the label and annotation when they drifted
// from s. The caller holds labelMu: the check loop (removals.go), the
// keeper and removals share it.
func (a *agent) reconcileLocked(ctx context.Context, s label.Summary) {
	// Compared as written, owner and writer included: an unowned key, or
	// one another pod wrote, with the right value is rewritten once, to
	// adopt it.
	s = a.labeler.Stamped(s)
	value, cur, ok, err := a.labeler.Current(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		a.log.Warn("reading the node label failed; rewriting it", "err", err)
	}
	if err == nil && a.written != nil && (!ok || value != a.written.Value() || !cur.Same(*a.written)) {
		a.log.Warn("the node label or annotation was changed by another writer since this agent wrote it", "key", a.labeler.Key, "wrote", a.written.Value(), "found", value)
		if a.metrics != nil {
			a.metrics.LabelConflict()
		}
	}
	if err == nil && ok && value == s.Value() && cur.Same(s) {
		a.log.Debug("label is current", "value", value)
		a.written = &s
		return
	}
	a.log.Info("label drifted; rewriting it", "was", value, "now", s.Value(), "summary", s.Text())
	if err := a.labeler.Apply(ctx, s); err != nil {
		if a.ownerConflict(ctx, err) {
			return
		}
		if ctx.Err() != nil {
			a.log.Info("label rewrite abandoned: terminating", "err", err)
			return
		}
		a.log.Error("labeling the node failed; will retry at the next check", "err", err)
		return
	}
	a.keyWritten()
	a.written = &s
	a.events.Record(ctx, s.FailureCount() == 0, s.Text())
}
