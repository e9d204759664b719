package slots_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// testTerminatedTake: SIGTERM while a take's write is on its way. The
// apiserver makes the write; the caller's connection is cut, as a
// terminating pod's is. The slot must not be left naming a holder nobody
// renews (issue 50: it was, for the lease duration, here a minute).
func (e *testEnv) testTerminatedTake(t *testing.T) {
	const instance = "terminated"
	token := e.agentToken(t, instance, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	cutOff := func(rt http.RoundTripper, r *http.Request) (*http.Response, error) {
		// The slot's write; the ticket's create comes first.
		slotWrite := strings.Contains(r.URL.Path, "/leases/"+instance+"-slot-") ||
			(r.Method == http.MethodPost && !strings.Contains(r.URL.Path, "/leases/") && isSlot(r))
		if (r.Method != http.MethodPost && r.Method != http.MethodPut) || !slotWrite {
			return rt.RoundTrip(r)
		}
		taking := false
		once.Do(func() { taking = true })
		if !taking {
			return rt.RoundTrip(r)
		}
		cancel() // SIGTERM
		// The request reaches the apiserver all the same.
		resp, err := rt.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
		if r.Context().Err() != nil {
			if err == nil {
				resp.Body.Close()
			}
			return nil, r.Context().Err() // the caller's connection was cut
		}
		return resp, err
	}
	cfg := slots.Config{Slots: 1, Identity: "pod", LeaseDuration: time.Minute, ReleaseGrace: 4 * time.Second}
	g := e.wrappedGate(t, token, instance, cfg, cutOff)
	h, err := g.Hold(ctx)
	if err == nil {
		h.Release()
		t.Fatal("Hold took a slot after its context ended")
	}
	name := slots.SlotName(instance, 0)
	l, err := e.admin.CoordinationV1().Leases(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the take's write was not made: %v", err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("after the wait ended, %s names %q, a holder nobody renews; want it cleared", name, *h)
	}
}

// isSlot says whether a create's body is a slot Lease (a create names the
// object in its body, not its path). It leaves the body readable.
func isSlot(r *http.Request) bool {
	if r.GetBody == nil {
		return false
	}
	body, err := r.GetBody()
	if err != nil {
		return false
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	return err == nil && strings.Contains(string(b), slots.LabelComponentSlot)
}
