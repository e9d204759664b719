package cli

import (
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func newSleep(deps *Deps) *cobra.Command {
	return &cobra.Command{
		Use:   "sleep",
		Short: "Wait for SIGTERM (compatible with the reference agent's main container)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			deps.Ready()
			<-ctx.Done()
			return nil
		},
	}
}
