package render_test

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/image-prefetcher/image-prefetcher/agent/cli"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
)

// TestPullDefaultsAreTheAgents: the pull timings an ImagePrefetcher leaves
// unset render to the agent's own flag defaults, so that the agent run by
// hand and the rendered DaemonSet behave alike (the function rendered 2m
// for --max-pull-attempt-delay, the agent's default is 10m).
func TestPullDefaultsAreTheAgents(t *testing.T) {
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind, Spec: v1alpha1.Spec{Images: []string{"debian:12"}}}
	ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
	c, probs := render.Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		t.Fatal(probs)
	}
	rendered := map[string]string{
		"initial-pull-attempt-timeout": c.InitialAttempt.String(),
		"max-pull-attempt-timeout":     c.MaxAttempt.String(),
		"overall-timeout":              c.OverallTimeout.String(),
		"initial-pull-attempt-delay":   c.InitialRetry.String(),
		"max-pull-attempt-delay":       c.MaxRetry.String(),
	}
	var fetch *cobra.Command
	for _, sub := range cli.New(cli.Deps{}).Commands() {
		if strings.HasPrefix(sub.Use, "fetch") {
			fetch = sub
		}
	}
	if fetch == nil {
		t.Fatal("the agent has no fetch command")
	}
	for flag, value := range rendered {
		f := fetch.Flags().Lookup(flag)
		if f == nil {
			t.Errorf("the agent has no --%s", flag)
			continue
		}
		if f.DefValue != value {
			t.Errorf("--%s: the function renders %s by default, the agent's default is %s", flag, value, f.DefValue)
		}
	}
}
