package e2e_test

import (
	"bytes"
	"testing"
	"time"
)

// deployWithRefresh deploys an instance whose watch checks every interval.
// The function refuses a refreshInterval below a minute (each check reads
// the Node, on every node), and the scenarios that wait for `watch` to
// notice a change cannot wait minutes: they render refreshInterval: 1m and
// shorten the rendered flag, a speed-up for tests only.
func (e env) deployWithRefresh(t *testing.T, in instance, interval time.Duration) *deployed {
	t.Helper()
	in.Spec += "  refreshInterval: 1m\n"
	manifests := e.render(t, in)
	const rendered = "--refresh-interval=1m0s"
	if !bytes.Contains(manifests, []byte(rendered)) {
		t.Fatalf("the rendered DaemonSet has no %s", rendered)
	}
	return e.deploy(t, in, bytes.ReplaceAll(manifests, []byte(rendered), []byte("--refresh-interval="+interval.String())))
}
