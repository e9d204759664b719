package slots

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// goneTicket writes a ticket, first in the queue, whose node has gone
// without deleting it (it crashed, or the delete failed).
func (f *fakeAPI) goneTicket(t *testing.T, g *Gate) string {
	t.Helper()
	name := g.cfg.Instance + "-wait-0000000000000000" // oldest: tickets of one age go by name
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}}
	g.ticketed(l, "gone-node")
	if _, err := f.leases().Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ticket: %v", err)
	}
	return name
}

// The waiters of issue 50's queue never see a heartbeat, and none of them
// looks at the slots while others wait with it. A slot whose holder died,
// or that a release handed to a ticket whose node has gone, is found by
// the holders of the first slots and handed to the next ticket.
func TestIdleSlotsGoToTheQueue(t *testing.T) {
	for _, tc := range []struct {
		name    string
		idle    func(h *Holding)
		janitor int // the slot of the holder that stays
	}{
		{"a dead holder's slot", crash, 0},
		{"a slot handed to a ticket whose node has gone", (*Holding).Release, 0},
		{"a dead holder of the first slot, seen by the second", crash, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const d = 600 * time.Millisecond
			f := newFakeAPI(t)
			g := f.gate(t, Config{Slots: 2, Identity: "holder"}, d)
			held := map[int]*Holding{}
			for range 2 {
				h := hold(t, g)
				held[h.Slot()] = h
			}
			gone := f.goneTicket(t, g)
			// Two waiting: neither is alone, so neither looks at the slots.
			w := f.gate(t, Config{Slots: 2, Identity: "waiter"}, d)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := waiters(ctx, t, w, 2)
			for f.requests()["watch"] < 2 {
				time.Sleep(time.Millisecond)
			}
			idle := held[1-tc.janitor]
			tc.idle(idle)
			select {
			case h := <-got:
				defer h.Release()
				if h.Slot() != idle.Slot() {
					t.Errorf("a waiter took slot %d, want the idle slot %d", h.Slot(), idle.Slot())
				}
			case <-ctx.Done():
				t.Fatalf("slot %d stayed idle for 30 s while two nodes waited", idle.Slot())
			}
			// Handed to the gone ticket first (it is oldest), then on.
			if _, err := f.leases().Get(ctx, gone, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the gone node's ticket %s is still there (err %v); want it deleted once its slot expired", gone, err)
			}
		})
	}
}

// An apiserver outage longer than the lease costs every holder its slot,
// and leaves no holder to look after the slots: the waiting nodes look
// again until a look a lease duration after the API answered them has
// judged the slots expired, and take them.
func TestOutageLeavesNoSlotIdle(t *testing.T) {
	const d = 600 * time.Millisecond
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, Identity: "holder"}, d)
	a := hold(t, g)
	f.goneTicket(t, g) // so that neither waiter is alone, and looks on its own
	w := f.gate(t, Config{Slots: 1, Identity: "waiter"}, d)
	w.retry = minRetry // the agent's own pauses: the API answers again a while after the last failure
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := waiters(ctx, t, w, 2)
	for f.requests()["watch"] < 2 {
		time.Sleep(time.Millisecond)
	}
	// A renewal the waiters have not seen: they judge the slot from the
	// version they see after the outage.
	seen := f.lease(t, a.Name()).ResourceVersion
	for f.lease(t, a.Name()).ResourceVersion == seen {
		time.Sleep(time.Millisecond)
	}
	// The outage: every call fails, and the holder's node dies with it.
	var failed atomic.Int64
	f.setHook(func(string, string, *coordinationv1.Lease) error {
		failed.Add(1)
		return apierrors.NewServiceUnavailable("the apiserver is down")
	})
	crash(a)
	f.endWatches()
	for failed.Load() < 4 { // both waiters failed, and failed again
		time.Sleep(time.Millisecond)
	}
	f.setHook(nil)
	select {
	case h := <-got:
		h.Release()
	case <-ctx.Done():
		t.Fatal("the dead holder's slot stayed idle for 30 s after the outage while two nodes waited")
	}
}

// flakyClient is one agent's Lease client: its calls fail while down is
// set, and it counts its lists of the slots.
type flakyClient struct {
	LeaseClient
	selector  string
	down      atomic.Bool
	failures  atomic.Int64
	slotLists atomic.Int64
}

func (c *flakyClient) fail() error {
	if c.down.Load() {
		c.failures.Add(1)
		return apierrors.NewServiceUnavailable("the apiserver is down")
	}
	return nil
}

func (c *flakyClient) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if opts.LabelSelector == c.selector {
		c.slotLists.Add(1)
	}
	if err := c.fail(); err != nil {
		return nil, err
	}
	return c.LeaseClient.List(ctx, opts)
}

func (c *flakyClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := c.fail(); err != nil {
		return nil, err
	}
	return c.LeaseClient.Watch(ctx, opts)
}

func (c *flakyClient) Create(ctx context.Context, l *coordinationv1.Lease,
	opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if err := c.fail(); err != nil {
		return nil, err
	}
	return c.LeaseClient.Create(ctx, l, opts)
}

func (c *flakyClient) Update(ctx context.Context, l *coordinationv1.Lease,
	opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := c.fail(); err != nil {
		return nil, err
	}
	return c.LeaseClient.Update(ctx, l, opts)
}

// A waiter the API failed once looks at the slots every lease duration
// only until it sees a holder of a first slot renew it: that holder looks
// after the slots. Before, it looked for the rest of its wait, and in the
// n1000-k100 scale run, where many waiters had a call time out as 1,000
// agents started, waiting cost 3.4 requests a minute, not 0.9.
func TestRecoveryEndsOnceAHolderRenews(t *testing.T) {
	const d = 300 * time.Millisecond // a look every d + 1 s while recovering
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, Identity: "holder"}, d)
	a := hold(t, g)
	defer a.Release()
	f.goneTicket(t, g) // so that the waiter is not alone, and does not look on its own
	c := &flakyClient{LeaseClient: f.leases()}
	w := f.gate(t, Config{Slots: 1, Identity: "waiter", Client: c}, d)
	c.selector = w.selector
	w.retry = minRetry
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := waiters(ctx, t, w, 1)
	for f.requests()["watch"] < 1 {
		time.Sleep(time.Millisecond)
	}
	// The waiter's watch ends and its calls fail for a moment; the
	// holder's renewals go on.
	c.down.Store(true)
	f.endWatches()
	for c.failures.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	c.down.Store(false)
	before := c.slotLists.Load()
	window := time.NewTimer(8 * time.Second)
	select {
	case h := <-got:
		h.Release()
		t.Fatal("the waiter took the held slot")
	case <-window.C:
	}
	if n := c.slotLists.Load() - before; n > 3 {
		t.Errorf("the waiter listed the slots %d times in 8 s after the API came back, want at most 3: "+
			"a look to compare with, one that sees the renewal, and one more at most", n)
	}
}
