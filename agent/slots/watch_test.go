package slots

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// waiters starts n Holds on g and returns their results as they come.
func waiters(ctx context.Context, t *testing.T, g *Gate, n int) <-chan *Holding {
	t.Helper()
	got := make(chan *Holding, n)
	for range n {
		go func() {
			h, err := g.Hold(ctx)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("Hold: %v", err)
				}
				return
			}
			got <- h
		}()
	}
	return got
}

// requests counts the calls the gates made to the API, by verb.
func (f *fakeAPI) requests() map[string]int {
	n := map[string]int{}
	for _, a := range f.cs.Actions() {
		n[a.GetVerb()]++
	}
	return n
}

// While every slot is busy and nothing changes, a waiting node sends no
// request at all when it watches, and keeps polling when it polls. When a
// slot is freed, one waiter takes it.
func TestWaitersSendNothingWhileNothingChanges(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(fmt.Sprintf("poll=%v", poll), func(t *testing.T) {
			const n = 20
			f := newFakeAPI(t)
			holderGate := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour, Identity: "holder"}, 0)
			a := hold(t, holderGate)
			g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour, Poll: poll}, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := waiters(ctx, t, g, n)
			// Let every waiter list and start its watch (or poll for a while).
			time.Sleep(300 * time.Millisecond)
			f.cs.ClearActions()
			time.Sleep(500 * time.Millisecond)
			quiet := f.requests()
			if poll {
				if quiet["get"] < n {
					t.Errorf("polling waiters sent %v in 500 ms, want at least one get each", quiet)
				}
			} else if len(quiet) != 0 {
				t.Errorf("watching waiters sent %v while nothing changed, want nothing", quiet)
			}
			a.Release()
			b := <-got
			defer b.Release()
			if l := f.lease(t, b.Name()); holder(l) != b.Identity() {
				t.Errorf("holder %q, want %q", holder(l), b.Identity())
			}
			select {
			case c := <-got:
				t.Fatalf("a second waiter got the only slot: %s", c.Identity())
			case <-time.After(200 * time.Millisecond):
			}
		})
	}
}

// A waiter that loses a race does not write to that slot again until the
// watch shows a newer version, and its window widens; slow hand-overs
// narrow it again.
func TestWindowAdapts(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	w := &watchWaiter{waiter: g.newWaiter(), window: time.Second, lostAt: map[string]string{},
		freeSince: map[string]time.Time{}, outside: map[int]bool{}, names: []string{"demo-slot-0"}, index: map[string]int{"demo-slot-0": 0},
		leases: map[string]*coordinationv1.Lease{}, since: map[string]time.Time{}}
	free := &coordinationv1.Lease{}
	free.Name, free.ResourceVersion = "demo-slot-0", "7"
	w.leases[free.Name] = free
	w.since[free.Name] = time.Now()
	w.lost(free.Name, "7")
	if w.window != 2*time.Second {
		t.Errorf("window after a lost race %v, want 2s", w.window)
	}
	if slots, _ := w.free(time.Now()); len(slots) != 0 {
		t.Errorf("free slots %v right after losing the race for the only one", slots)
	}
	for range 20 {
		w.lost(free.Name, "7")
	}
	if w.window != maxWindow {
		t.Errorf("window %v, want capped at %v", w.window, maxWindow)
	}
	other := "other"
	taken := free.DeepCopy()
	taken.ResourceVersion, taken.Spec.HolderIdentity = "8", &other
	released := free.DeepCopy()
	released.ResourceVersion = "9"
	t0 := time.Now()
	w.timeHandOver(taken, released, t0)
	w.timeHandOver(released, taken, t0.Add(quietGap+time.Millisecond))
	if w.window != maxWindow/2 {
		t.Errorf("window after a slow hand-over %v, want %v", w.window, maxWindow/2)
	}
	w.timeHandOver(taken, released, t0)
	w.timeHandOver(released, taken, t0.Add(quietGap/2))
	if w.window != maxWindow/2 {
		t.Errorf("window after a quick hand-over %v, want unchanged %v", w.window, maxWindow/2)
	}
}

// An older Role has no list or watch on Leases: the waiter polls instead.
func TestWatchForbiddenFallsBackToPolling(t *testing.T) {
	f := newFakeAPI(t)
	f.setHook(func(verb, name string, _ *coordinationv1.Lease) error {
		if verb == "list" || verb == "watch" {
			return apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "", errors.New("RBAC: no list"))
		}
		return nil
	})
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	a := hold(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := waiters(ctx, t, g, 1)
	time.Sleep(100 * time.Millisecond)
	a.Release()
	b := <-got
	b.Release()
	if f.requests()["get"] == 0 {
		t.Error("no gets: the waiter did not poll")
	}
}

// The apiserver ends watches (at their timeout, on restart): the waiter
// lists again and still sees the slot freed.
func TestWatchEndsAndWaiterListsAgain(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	a := hold(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := waiters(ctx, t, g, 1)
	time.Sleep(100 * time.Millisecond)
	before := f.listCount()
	f.endWatches()
	time.Sleep(100 * time.Millisecond)
	if f.listCount() <= before {
		t.Errorf("lists %d after the watch ended, want more than %d", f.listCount(), before)
	}
	a.Release()
	b := <-got
	b.Release()
}

// The answer to a successful take is lost (a timeout): the watch shows us
// as holder, and the waiter holds the slot rather than waiting for its
// own Lease to expire.
func TestLostAnswerIsAdopted(t *testing.T) {
	f := newFakeAPI(t)
	f.write(t, SlotName("demo", 0), func(l *coordinationv1.Lease) {
		l.Labels = map[string]string{LabelInstance: "demo", LabelComponent: LabelComponentSlot}
	})
	var once sync.Once
	f.setHook(func(verb, name string, lease *coordinationv1.Lease) error {
		var err error
		if verb == "update" {
			once.Do(func() {
				f.sneak(t, name, func(l *coordinationv1.Lease) { l.Spec = lease.Spec })
				err = apierrors.NewServerTimeout(leasesGVR.GroupResource(), "update", 1)
			})
		}
		return err
	})
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	h := hold(t, g)
	if l := f.lease(t, h.Name()); holder(l) != h.Identity() {
		t.Fatalf("holder %q, want %q", holder(l), h.Identity())
	}
	if got := f.requests()["update"]; got != 1 {
		t.Errorf("%d updates, want the one whose answer was lost", got)
	}
}

// Many watching waiters and a few slots: never more than K holders, and
// every waiter gets a slot in the end.
func TestManyWatchersNeverExceedK(t *testing.T) {
	const k, n = 3, 30
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: k, LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	held, peak := 0, 0
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := g.Hold(ctx)
			if err != nil {
				t.Errorf("Hold: %v", err)
				return
			}
			mu.Lock()
			held++
			peak = max(peak, held)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			held--
			mu.Unlock()
			h.Release()
		}()
	}
	wg.Wait()
	if peak > k {
		t.Errorf("peak holders %d, want at most %d", peak, k)
	}
}
