package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/image-prefetcher/image-prefetcher/agent/allowlist"
)

// newAllowlist prints the kubelet configuration that keeps an instance's
// private images private (docs/security.md): the public images, those its
// agents pull without credentials, allowlisted.
func newAllowlist(deps *Deps) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "allowlist",
		Short: "Print the kubelet's preloadedImagesVerificationAllowlist for the public images of rendered manifests",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var in io.Reader = cmd.InOrStdin()
			if file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			public, err := allowlist.Public(in)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			entries, err := allowlist.Entries(public)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			_, err = io.WriteString(deps.Stdout, allowlist.Snippet(entries))
			return err
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "-", "rendered manifests (kustomize build or kpt fn render output); - reads standard input")
	return cmd
}
