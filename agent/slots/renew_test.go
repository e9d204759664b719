package slots

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// TestRenewCadence pins what docs/herd.md states: a holder renews every
// third of the lease duration and counts its slot lost after two thirds
// without a successful renewal, leaving a third for a takeover to wait out.
func TestRenewCadence(t *testing.T) {
	for _, d := range []time.Duration{0, 30 * time.Second} {
		leases := fake.NewSimpleClientset().CoordinationV1().Leases("ns")
		g, err := New(Config{Client: leases, Namespace: "ns", Instance: "demo",
			Slots: 1, Identity: "pod", LeaseDuration: d})
		if err != nil {
			t.Fatal(err)
		}
		lease := g.cfg.LeaseDuration
		if got := g.renewInterval(); got != lease/3 {
			t.Errorf("lease %v: renew every %v, want %v", lease, got, lease/3)
		}
		if got := g.renewDeadline(); got != lease*2/3 {
			t.Errorf("lease %v: slot lost after %v, want %v", lease, got, lease*2/3)
		}
	}
}
