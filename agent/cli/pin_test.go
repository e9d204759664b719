package cli

import (
	"strings"
	"testing"
)

// A budget that is neither a share nor a quantity is a usage error that
// names the flag, before anything is pulled.
func TestPinBudgetUsage(t *testing.T) {
	for _, budget := range []string{"lots", "120%", "-1Gi"} {
		e := newEnv(t)
		if code := e.run("fetch", "--cri-socket="+e.cri.Socket, "--label-node=false", "--pin-budget="+budget, "x:1"); code != ExitUsage {
			t.Errorf("--pin-budget=%s: exit %d, want %d", budget, code, ExitUsage)
		}
		if got := e.logs.String(); !strings.Contains(got, "--pin-budget") {
			t.Errorf("--pin-budget=%s: the error does not name the flag:\n%s", budget, got)
		}
	}
}
