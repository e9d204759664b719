package label

import (
	"testing"
	"time"
)

// TestAttemptTimeoutDefault pins docs/agent.md's "each attempt has its own
// 10 s timeout" for a Labeler that sets none, and that a set one wins.
func TestAttemptTimeoutDefault(t *testing.T) {
	if got := (&Labeler{}).attemptTimeout(); got != 10*time.Second {
		t.Errorf("default attempt timeout %v, want 10s", got)
	}
	if got := (&Labeler{AttemptTimeout: 3 * time.Second}).attemptTimeout(); got != 3*time.Second {
		t.Errorf("set attempt timeout %v, want 3s", got)
	}
}
