package creds

import (
	"testing"
	"time"
)

// TestPluginBoundsAsDocumented pins docs/agent.md: each plugin run gets
// 1 minute unless configured, and its pipes are waited for 2 s after it
// exits (TestHungPluginIsBounded shows both bounds at work).
func TestPluginBoundsAsDocumented(t *testing.T) {
	if DefaultPluginTimeout != time.Minute {
		t.Errorf("DefaultPluginTimeout = %v, want 1m", DefaultPluginTimeout)
	}
	if pluginWaitDelay != 2*time.Second {
		t.Errorf("pluginWaitDelay = %v, want 2s", pluginWaitDelay)
	}
}
