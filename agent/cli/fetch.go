package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newFetch(deps *Deps) *cobra.Command {
	f := &agentFlags{}
	var failOnError bool
	cmd := &cobra.Command{
		Use:   "fetch [flags] [IMAGE...]",
		Short: "Pull every image of the list once, then label the node (the init container)",
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			start := time.Now()
			f.parsed(cmd)
			a := newAgent(f, deps)
			if err := a.init(ctx, args); err != nil {
				a.failOpenTaint(ctx)
				return err
			}
			defer a.cri.Close()
			// maxWait may pass while pulling: the taint then goes meanwhile.
			stopTaint := a.watchTaint(ctx)
			defer stopTaint()
			results := a.puller.Run(ctx, a.entries, "")
			s := summarize(results, time.Since(start))
			a.observe(s)
			ok := s.FailureCount() == 0
			if ok {
				a.log.Info("prefetch complete", "summary", s.Text())
			} else {
				a.log.Warn("prefetch incomplete", "summary", s.Text())
			}
			if a.labeler != nil {
				if err := a.labeler.Apply(ctx, s); err != nil {
					a.log.Error("labeling the node failed; exiting non-zero so that the kubelet retries", "err", err)
					return &ExitCodeError{Code: ExitError, Err: errSilent}
				}
				a.log.Info("node labeled", "key", a.labeler.Key, "value", s.Value())
			}
			stopTaint()
			a.settleTaint(ctx)
			a.events.Record(ctx, ok, s.Text())
			if !ok && failOnError {
				return &ExitCodeError{Code: ExitImagesFailed, Err: fmt.Errorf("%d of %d images failed", s.FailureCount(), s.Total)}
			}
			return nil
		},
	}
	f.register(cmd, deps.Getenv)
	cmd.Flags().BoolVar(&failOnError, "fail-on-error", false, "exit non-zero when any image failed (the label is written first)")
	return cmd
}
