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
				return err
			}
			defer a.cri.Close()
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
					if a.ownerConflict(ctx, err) {
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
