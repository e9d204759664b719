package cli

import (
	"strings"
	"testing"
	"time"
)

// TestDocumentedFlagDefaults pins the defaults docs/agent.md states for
// flags whose behaviour other tests exercise with shorter values.
func TestDocumentedFlagDefaults(t *testing.T) {
	deps := newEnv(t).deps()
	tests := []struct {
		cmd, flag string
		want      time.Duration
	}{
		// "retried with backoff for up to 2 minutes"
		{"fetch", "label-retry-timeout", 2 * time.Minute},
		{"watch", "label-retry-timeout", 2 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.cmd+"/"+tt.flag, func(t *testing.T) {
			cmd := newFetch(&deps)
			if tt.cmd == "watch" {
				cmd = newWatch(&deps)
			}
			f := cmd.Flags().Lookup(tt.flag)
			if f == nil {
				t.Fatalf("%s has no --%s", tt.cmd, tt.flag)
			}
			got, err := time.ParseDuration(f.DefValue)
			if err != nil || got != tt.want {
				t.Errorf("--%s defaults to %q, want %v", tt.flag, f.DefValue, tt.want)
			}
		})
	}
}

// TestFetchSeedNodesNeedsMaxConcurrentNodes: seeding without a cap is a
// usage error, not a silent no-op.
func TestFetchSeedNodesNeedsMaxConcurrentNodes(t *testing.T) {
	e := newEnv(t)
	code := e.run("fetch", "--cri-socket="+e.cri.Socket, "--label-node=false", "--seed-nodes=2", "x:1")
	if code == 0 {
		t.Fatalf("exit 0, want non-zero")
	}
	if got := e.logs.String(); !strings.Contains(got, "--seed-nodes needs --max-concurrent-nodes") {
		t.Errorf("log does not name the missing flag:\n%s", got)
	}
}
