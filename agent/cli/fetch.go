package cli

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// announcePulls runs before fetch pulls anything. When the node already
// carries this instance's key (watch kept it across a rollout, or a pod
// restarted), it is made to tell the truth at once: a changed list whose
// new images are not there yet is failed, with those images as Missing,
// until they are pulled. A rollout that changes nothing the node lacks
// pulls nothing, so the label never leaves succeeded. On a node without
// the key nothing is written until the pull ends, as before.
func (a *agent) announcePulls(ctx context.Context, results []pull.Result) {
	if a.labeler == nil {
		return
	}
	if _, _, ok, err := a.labeler.Current(ctx); err != nil || !ok {
		return
	}
	s := pendingSummary(results)
	a.log.Info("images to pull; the label says so until they are there", "summary", s.Text())
	if err := a.labeler.Apply(ctx, s); err != nil {
		a.log.Warn("could not mark the label while pulling; it is rewritten when the pull ends", "err", err)
		return
	}
	a.pending = true
}

// fetchReleaseGrace is how long fetch, once terminated, waits for its slot
// to be given back: a seed writes slot 0 first, then clears its own. The
// pod's termination grace period (30 s by default) leaves room.
const fetchReleaseGrace = 5 * time.Second

// fetchSettleBudget bounds settling the key when fetch is terminated
// mid-pull, as watch's --remove-label-timeout does.
const fetchSettleBudget = 4 * time.Second

// settleIfTerminated: a key this run already wrote (a registration, the
// images being pulled) must not outlive the instance when fetch is
// terminated before its pull ended, while starting or while pulling: it is
// settled as watch settles it on SIGTERM.
func (a *agent) settleIfTerminated(ctx context.Context) {
	if ctx.Err() != nil && a.pending {
		_ = a.settleKey(ctx, time.Now().Add(fetchSettleBudget))
	}
}

func newFetch(deps *Deps) *cobra.Command {
	f := &agentFlags{}
	var failOnError bool
	cmd := &cobra.Command{
		Use:   "fetch [flags] [IMAGE...]",
		Short: "Pull every image of the list once, then label the node (the init container)",
		RunE: func(cmd *cobra.Command, args []string) error {
			// The DaemonSet controller deletes not-ready pods first during an
			// update. On SIGTERM the pulls are cancelled, and the herd-control
			// slot is given back (a seed records that it is done) instead of
			// blocking every other node for a lease duration.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			start := time.Now()
			f.parsed(cmd)
			a := newAgent(f, deps)
			a.registers = true
			a.releaseGrace = fetchReleaseGrace
			a.serveCtx = cmd.Context()
			a.onWaiting = func(results []pull.Result) { a.announcePulls(ctx, results) }
			if err := a.init(ctx, args); err != nil {
				a.failOpenTaint(ctx)
				a.settleIfTerminated(ctx)
				return err
			}
			defer a.cri.Close()
			// maxWait may pass while pulling: the taint then goes meanwhile.
			stopTaint := a.watchTaint(ctx)
			defer stopTaint()
			results := a.puller.Run(ctx, a.entries, "")
			if ctx.Err() != nil {
				// A label from a run cut short would report images as failed
				// that were only interrupted.
				a.log.Warn("terminated before the pull finished; not labeling the node")
				a.settleIfTerminated(ctx)
				return &ExitCodeError{Code: ExitError, Err: errSilent}
			}
			a.gcSeen(results)
			s := pull.Summarize(results, time.Since(start))
			pins, waitPins := a.pinBehind(ctx, results)
			defer waitPins()
			s.SetPins(pins)
			s.Disk = a.diskState(ctx)
			a.observe(s)
			ok := s.FailureCount() == 0
			if ok {
				a.log.Info("prefetch complete", "summary", s.Text())
			} else {
				a.log.Warn("prefetch incomplete", "summary", s.Text())
			}
			// The startup taint is this run's: it goes when every image is
			// present, once the label says so, or without the label when
			// the key cannot be written.
			settleTaint := func() {
				stopTaint()
				a.taintDone(results)
				a.settleTaint(ctx)
			}
			if a.labeler != nil {
				if err := a.labeler.Apply(ctx, s); err != nil {
					settleTaint()
					if a.ownerConflict(ctx, err) {
						// Pins serve the key, which is another instance's
						// here; and this pod's watch, which unpins when the
						// instance goes, never runs: leave no pin behind.
						waitPins()
						a.unpinAll(ctx, time.Now())
						// The init container fails, so that the pod shows the
						// conflict rather than run beside a label that lies.
						return &ExitCodeError{Code: ExitOwnerConflict, Err: errSilent}
					}
					a.log.Error("labeling the node failed; exiting non-zero so that the kubelet retries", "err", err)
					return &ExitCodeError{Code: ExitError, Err: errSilent}
				}
				a.log.Info("node labeled", "key", a.labeler.Key, "value", s.Value())
				a.keyWritten()
			}
			settleTaint()
			a.events.Record(ctx, ok, s.Text())
			if !ok && failOnError {
				return &ExitCodeError{Code: ExitImagesFailed, Err: fmt.Errorf("%d of %d images failed", s.FailureCount(), s.Total)}
			}
			return nil
		},
	}
	f.register(cmd, deps)
	cmd.Flags().BoolVar(&failOnError, "fail-on-error", false, "exit non-zero when any image failed (the label is written first)")
	return cmd
}
