package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// StartForTest starts a cluster for t and tears it down when t ends,
// failing t if the teardown leaves anything behind. When t failed, the end
// of every component log is written to the test log first.
func StartForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs(t)
		}
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
		if left := c.Leftovers(); len(left) > 0 {
			t.Errorf("teardown left behind:\n  %s", strings.Join(left, "\n  "))
		}
	})
	return c
}

// DumpLogs writes the end of every component log to the test log.
func (c *Cluster) DumpLogs(t testing.TB) {
	logs, _ := filepath.Glob(c.path("logs", "*.log"))
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.Size() > 0 {
			t.Logf("---- last lines of %s:\n%s", filepath.Base(l), tail(l, 25))
		}
	}
}
