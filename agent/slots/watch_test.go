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
	handOver := func(delay time.Duration) time.Duration {
		t0 := time.Now()
		w.steer(taken, released, t0)
		next := taken.DeepCopy()
		next.Annotations = map[string]string{TakeDelayAnnotation: delay.String()}
		w.steer(released, next, t0.Add(delay)) // no latency: the take is seen as it is made
		return w.window
	}
	w.window = time.Second
	for _, step := range []struct {
		delay time.Duration
		want  func(prev time.Duration) time.Duration
	}{
		{2 * targetDelay, func(p time.Duration) time.Duration { return p * 10 / 11 }}, // winners wait longer than the target: narrower
		{time.Hour, func(p time.Duration) time.Duration { return p * 10 / 11 }},       // by the same step, however late
		{targetDelay / 2, func(p time.Duration) time.Duration { return p * 11 / 10 }}, // sooner: wider, fewer losers
		{0, func(p time.Duration) time.Duration { return p * 11 / 10 }},               // by the same step, however soon
		{targetDelay, func(p time.Duration) time.Duration { return p }},               // on target: kept
	} {
		prev := w.window
		if got, want := handOver(step.delay), step.want(prev); got != want {
			t.Errorf("after a take delayed %v: window %v, want %v", step.delay, got, want)
		}
	}
	for range 100 {
		handOver(time.Hour)
	}
	if w.window != minWindow {
		t.Errorf("window %v after many late takes, want the floor %v", w.window, minWindow)
	}
	// Takes seen 200 ms after their winners made them: a busy apiserver.
	// The target becomes twice that, so a 140 ms delay is early.
	w.window = time.Second
	for range 50 {
		t0 := time.Now()
		w.steer(taken, released, t0)
		next := taken.DeepCopy()
		next.Annotations = map[string]string{TakeDelayAnnotation: (2 * targetDelay).String()}
		w.steer(released, next, t0.Add(2*targetDelay+200*time.Millisecond))
	}
	if w.latency < 190*time.Millisecond || w.latency > 200*time.Millisecond || w.target() != 2*w.latency {
		t.Errorf("latency %v target %v after takes seen 200 ms late", w.latency, w.target())
	}
	if w.window <= time.Second {
		t.Errorf("window %v after takes 140 ms late on a busy apiserver, want wider than 1s", w.window)
	}
	w.window, w.latency = minWindow, 0
	// A renewal, or a take that reports no delay (an older agent), steers nothing.
	renewed := taken.DeepCopy()
	renewed.Annotations = map[string]string{TakeDelayAnnotation: "1h"}
	w.steer(taken, renewed, time.Now())
	w.steer(released, taken, time.Now())
	if w.window != minWindow {
		t.Errorf("window %v after a renewal and an unreported take, want %v", w.window, minWindow)
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

// A lone waiter with a wide window does not wait it out: a slot that
// stays free shrinks the window until the waiter takes it. The window
// here is 10 min; without the shrinking, a take within 30 s would come
// one time in twenty.
func TestLoneWaiterDoesNotWaitOutItsWindow(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 2, LeaseDuration: time.Hour}, 0)
	g.firstWindow = 10 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := g.Hold(ctx)
	if err != nil {
		t.Fatalf("Hold: %v", err)
	}
	h.Release()
}

// A take by update reports its delay for the other waiters to steer by.
func TestTakeReportsItsDelay(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	a := hold(t, g)
	a.Release()
	b := hold(t, g)
	d, err := time.ParseDuration(f.lease(t, b.Name()).Annotations[TakeDelayAnnotation])
	if err != nil || d < 0 {
		t.Errorf("%s = %q: %v", TakeDelayAnnotation, f.lease(t, b.Name()).Annotations[TakeDelayAnnotation], err)
	}
}
