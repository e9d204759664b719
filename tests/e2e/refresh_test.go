package e2e_test

import (
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// deployWithRefresh deploys an instance whose watch checks every interval.
// The function refuses a refreshInterval below a minute (each check reads
// the Node, on every node), and the scenarios that wait for `watch` to
// notice a change cannot wait minutes: they render refreshInterval: 1m and
// shorten the rendered flag, a speed-up for tests only.
func (e env) deployWithRefresh(t *testing.T, in instance, interval time.Duration) *deployed {
	t.Helper()
	in.Spec += "  refreshInterval: 1m\n"
	manifests, err := cluster.ShortenRefresh(e.render(t, in), interval)
	if err != nil {
		t.Fatal(err)
	}
	return e.deploy(t, in, manifests)
}
