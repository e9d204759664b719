package slots

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A waiting node at K = 1 must not be left waiting for its watch's end
// (5-10 min) by an apiserver restart or by a holder that dies as it
// leaves the queue: the two ways make test's real clusters found
// (tests/interact TestAPIOutage, tests/e2e Test15HerdCap).

// After an apiserver restart, a watch from the ticket's version is
// answered 410 Gone. The waiter resumes from the version at which it read
// the ticket again, not from the ticket's own (which is answered 410 Gone
// again, a round a second for as long as the ticket does not change), and
// a grant then reaches it.
func TestRestartedAPIServerIsWatchedFromNow(t *testing.T) {
	f := newFakeAPI(t)
	a := hold(t, f.gate(t, Config{Slots: 1, Identity: "holder", LeaseDuration: time.Hour}, 0))
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := f.watching(ctx, t, g)
	f.write(t, "elsewhere", func(*coordinationv1.Lease) {}) // the cluster's version moves on past the ticket's
	f.restart()
	f.cs.ClearActions()
	for f.requests()["watch"] < 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(3 * time.Second) // three rounds' worth, had it looped
	if n := f.requests()["watch"]; n > 2 {
		t.Errorf("%d watches in 3 s after the restart, want 2: the one answered 410 Gone and the one resumed after it", n)
	}
	a.Release()
	select {
	case h := <-got:
		h.Release()
	case <-ctx.Done():
		t.Fatal("the waiting node was not handed the released slot after the restart")
	}
}

// instantWatches is the fake's Lease client, except that every watch ends
// at once with nothing in it, as behind a proxy that cuts idle streams.
type instantWatches struct{ endingWatches }

// A look that lookTimer has set is due from the last look, however often
// the watch ends meanwhile: before, each resumed watch started its timer
// again, and watches that ended every second put the look off for good.
func TestEndingWatchesDoNotPutOffLooks(t *testing.T) {
	const d = 300 * time.Millisecond
	f := newFakeAPI(t)
	a := hold(t, f.gate(t, Config{Slots: 1, Identity: "holder"}, d))
	crash(a)
	f.goneTicket(t, f.gate(t, Config{Slots: 1}, d)) // so that the waiter is not alone
	// One failed ticket write: the API failed the waiter, so it looks
	// every lease duration (waiter.recovering).
	var once sync.Once
	f.setHook(func(verb, name string, _ *coordinationv1.Lease) error {
		var err error
		if verb == "create" && strings.Contains(name, "-wait-") {
			once.Do(func() { err = apierrors.NewServiceUnavailable("the apiserver is restarting") })
		}
		return err
	})
	c := &instantWatches{endingWatches{LeaseClient: f.leases()}}
	g := f.gate(t, Config{Slots: 1, Identity: "waiter", Client: c}, d)
	h := holdWithin(t, g, 10*time.Second)
	if h.Slot() != a.Slot() {
		t.Errorf("took slot %d, want %d, the dead holder's", h.Slot(), a.Slot())
	}
}

// A node that has just taken the only slot deletes its ticket after its
// take, and a waiter that lists the tickets in between sees it. If that
// holder dies, no holder looks after the slot, so the waiter must count
// itself alone and look: a ticket whose node holds a slot is not counted.
func TestLeavingTicketDoesNotHideALoneWaiter(t *testing.T) {
	const d = 300 * time.Millisecond
	f := newFakeAPI(t)
	victim := f.gate(t, Config{Slots: 1, Identity: "victim"}, d)
	a := hold(t, victim)
	crash(a)
	// Its ticket, not yet deleted: named for the same node as its take.
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "demo-wait-0000000000000000", Namespace: testNS}}
	victim.ticketed(l, "victim-0000beef")
	if _, err := f.leases().Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g := f.gate(t, Config{Slots: 1, Identity: "waiter"}, d)
	h := holdWithin(t, g, 2*alonePoll)
	if h.Slot() != a.Slot() {
		t.Errorf("took slot %d, want %d, the dead holder's", h.Slot(), a.Slot())
	}
}

// A holder cut off by an outage loses its slot, and its release fails
// while the apiserver is down. It gives the slot back once the API
// answers: before, the slot named it until a node that could see it had
// judged it expired, and after an outage every holder's slot was such a
// one (n1000-k50-outage30s: the last of the K slots held again 57 s after
// the apiserver was ready).
func TestLostSlotIsGivenBackOnceTheAPIAnswers(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, CallTimeout: 100 * time.Millisecond}, 300*time.Millisecond)
	h := hold(t, g)
	f.setHook(func(string, string, *coordinationv1.Lease) error {
		return apierrors.NewServiceUnavailable("the apiserver is down")
	})
	<-h.Lost()
	h.Release() // fails: the API is still down
	if l := f.lease(t, h.Name()); holder(l) != h.id {
		t.Fatalf("the slot names %q while the API is down, want the lost holder %q", holder(l), h.id)
	}
	f.setHook(nil)
	deadline := time.Now().Add(5 * time.Second)
	for holder(f.lease(t, h.Name())) == h.id {
		if time.Now().After(deadline) {
			t.Fatal("the lost slot still names its holder 5 s after the API answered again")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
