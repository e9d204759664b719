package cli

import (
	"context"
	"math/rand/v2"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

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
			a, err := setup(ctx, f, deps, args)
			if err != nil {
				return err
			}
			defer a.cri.Close()
			deps.Ready()
			if refresh > 0 {
				a.log.Info("watching", "images", len(a.entries), "refreshInterval", refresh)
				for {
					a.check(ctx)
					if sleepCtx(ctx, jitter(refresh)) != nil {
						break
					}
				}
			} else {
				a.log.Info("periodic checks disabled (--refresh-interval=0); waiting for SIGTERM")
				<-ctx.Done()
			}
			a.log.Info("terminating")
			if a.labeler != nil && removeOnExit {
				if err := a.labeler.Remove(context.WithoutCancel(ctx), removeBudget); err != nil {
					a.log.Error("removing the node label failed", "err", err)
					return &ExitCodeError{Code: ExitError, Err: errSilent}
				}
				a.log.Info("node label removed", "key", a.labeler.Key)
			}
			return nil
		},
	}
	f.register(cmd, deps.Getenv)
	cmd.Flags().DurationVar(&refresh, "refresh-interval", 10*time.Minute, "how often images and the label are checked (±10% jitter); 0 disables the checks")
	cmd.Flags().BoolVar(&removeOnExit, "remove-label-on-exit", true, "remove this instance's node label and annotation on SIGTERM")
	// 3s keeps the whole shutdown inside 5s, even with the API server down.
	cmd.Flags().DurationVar(&removeBudget, "remove-label-timeout", 3*time.Second, "how long removing the label on SIGTERM may retry")
	_ = cmd.Flags().MarkHidden("remove-label-timeout")
	return cmd
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
	if ctx.Err() != nil {
		return
	}
	for _, r := range results {
		if r.Pulled {
			a.log.Info("image was missing and has been pulled again", "image", r.Normalized)
		}
	}
	s := summarize(results, time.Since(start))
	a.observe(s)
	if a.labeler == nil {
		return
	}
	value, cur, ok, err := a.labeler.Current(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		a.log.Warn("reading the node label failed; rewriting it", "err", err)
	}
	if err == nil && ok && value == s.Value() && cur.Same(s) {
		a.log.Debug("label is current", "value", value)
		return
	}
	a.log.Info("label drifted; rewriting it", "was", value, "now", s.Value(), "summary", s.Text())
	if err := a.labeler.Apply(ctx, s); err != nil {
		a.log.Error("labeling the node failed; will retry at the next check", "err", err)
		return
	}
	a.events.Record(ctx, s.FailureCount() == 0, s.Text())
}
