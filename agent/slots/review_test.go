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
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// The five cases of the review in issue 34, each a waiting node that
// must not be kept from a free slot, or must not flood the apiserver.

// oldSlot makes slot i free, as an older agent left it: with the index
// label it wrote, and slot 0 seeded for another list.
func (f *fakeAPI) oldSlot(t *testing.T, i int) {
	t.Helper()
	f.write(t, SlotName("demo", i), func(l *coordinationv1.Lease) {
		l.Labels = map[string]string{
			LabelInstance:                  "demo",
			LabelComponent:                 LabelComponentSlot,
			v1alpha1.LabelDomain + "/slot": "0",
		}
		l.Annotations = map[string]string{SeededAnnotation: "the-previous-list"}
	})
}

// holdAll holds all k slots, by slot.
func (f *fakeAPI) holdAll(t *testing.T, k int) map[int]*Holding {
	t.Helper()
	held := map[int]*Holding{}
	holders := f.gate(t, Config{Slots: k, Identity: "holder", LeaseDuration: time.Hour}, 0)
	for range k {
		h := hold(t, holders)
		held[h.Slot()] = h
	}
	// Each take lists the slots once, and the holders of the first slots
	// list them as they start to look after them (janitor.go): those
	// lists come from the holders, not from a waiter counted later.
	for f.requests()["list"] < k+min(k, janitors) {
		time.Sleep(time.Millisecond)
	}
	return held
}

// watching starts one waiter of g and returns what it takes once its
// watch has started.
func (f *fakeAPI) watching(ctx context.Context, t *testing.T, g *Gate) <-chan *Holding {
	t.Helper()
	f.cs.ClearActions()
	got := waiters(ctx, t, g, 1)
	for f.requests()["watch"] < 1 {
		time.Sleep(time.Millisecond)
	}
	return got
}

// holdWithin holds a slot of g within d, or fails the test.
func holdWithin(t *testing.T, g *Gate, d time.Duration) *Holding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	h, err := g.Hold(ctx)
	if err != nil {
		t.Fatalf("a lone waiting node did not take a free slot within %s: %v", d, err)
	}
	t.Cleanup(h.Release)
	return h
}

// 1. Seed mode: one node waits alone (the list changed, the autoscaler
// added it) and seed slot 0 is free: it takes it, whatever it drew.
func TestReviewLoneSeedTakesTheSeedSlot(t *testing.T) {
	for range 6 {
		f := newFakeAPI(t)
		f.oldSlot(t, 0)
		g := f.gate(t, Config{Slots: 10, SeedNodes: 1, SeedKey: "this-list", LeaseDuration: time.Hour}, 0)
		if h := holdWithin(t, g, 5*time.Second); !h.seed || h.Slot() != 0 {
			t.Fatalf("took slot %d as seed %v, want seed slot 0", h.Slot(), h.seed)
		}
	}
}

// 2. Seven of eight slots are free while the eighth turns over and the
// waiter loses every race for it: it takes one of the seven.
func TestReviewFreeSlotsAreTakenWhileOneTurnsOver(t *testing.T) {
	const k = 8
	f := newFakeAPI(t)
	held := f.holdAll(t, k)
	g := f.gate(t, Config{Slots: k, LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := f.watching(ctx, t, g)
	const busy = 0 // the slot that turns over (the waiter's own group's, when there were groups)
	name := SlotName("demo", busy)
	f.setHook(func(verb, n string, l *coordinationv1.Lease) error {
		if verb == "update" && n == name && strings.HasPrefix(holder(l), "pod-") {
			f.sneak(t, name, func(l *coordinationv1.Lease) { id := "other"; l.Spec.HolderIdentity = &id })
		}
		return nil
	})
	for _, h := range held {
		h.Release()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { // the other node releases the busy slot soon after each take, as a busy group turns over
		defer wg.Done()
		for ctx.Err() == nil {
			if l := f.lease(t, name); holder(l) == "other" {
				f.write(t, name, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	select {
	case h := <-got:
		h.Release()
		if h.Slot() == busy {
			t.Errorf("took the busy slot %d, whose every take the hook lost", busy)
		}
	case <-ctx.Done():
		t.Fatalf("a node waited 10 s with %d slots free", k-1)
	}
	cancel()
}

// 3. A node joining alone after the herd is done takes the free slot
// within seconds, also after a failed first list.
func TestReviewLoneJoinerTakesTheFreeSlot(t *testing.T) {
	for _, failFirstList := range []bool{false, true} {
		f := newFakeAPI(t)
		f.labeledSlot(t, 0)
		g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
		g.retry = minRetry // as deployed
		var once sync.Once
		f.setHook(func(verb, _ string, _ *coordinationv1.Lease) error {
			var err error
			if verb == "list" && failFirstList {
				once.Do(func() { err = apierrors.NewServiceUnavailable("restarting") })
			}
			return err
		})
		holdWithin(t, g, 10*time.Second)
	}
}

// endingWatches is the fake's Lease client, except that every watch
// answers 410 Gone (gone) or ends at once with nothing in it; it records
// when each list was sent.
type endingWatches struct {
	LeaseClient
	gone  bool
	mu    sync.Mutex
	lists []time.Time
}

func (c *endingWatches) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if strings.Contains(opts.LabelSelector, LabelComponentSlot) {
		c.mu.Lock()
		c.lists = append(c.lists, time.Now())
		c.mu.Unlock()
	}
	return c.LeaseClient.List(ctx, opts)
}

func (c *endingWatches) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w := watch.NewFakeWithChanSize(1, false)
	if c.gone {
		w.Error(&apierrors.NewGone("too old resource version").ErrStatus)
	}
	w.Stop()
	return w, nil
}

// 4. A watch answered 410 Gone, or ended at once, is followed by a list
// of the slots no sooner than a second after the one before.
func TestReviewEndedWatchListsAtMostOncePerSecond(t *testing.T) {
	for _, gone := range []bool{true, false} {
		f := newFakeAPI(t)
		f.holdAll(t, 1)
		c := &endingWatches{LeaseClient: f.leases(), gone: gone}
		g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour, Client: c}, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		if _, err := g.Hold(ctx); ctx.Err() == nil {
			t.Fatalf("Hold ended before its context: %v", err)
		}
		cancel()
		c.mu.Lock()
		for i := 1; i < len(c.lists); i++ {
			if gap := c.lists[i].Sub(c.lists[i-1]); gap < 990*time.Millisecond {
				t.Errorf("410 Gone %v: %d lists in 2.5 s, list %d only %s after the one before", gone, len(c.lists), i, gap)
				break
			}
		}
		c.mu.Unlock()
	}
}

// 5. A waiting node that finds every slot busy writes its ticket, lists
// the slots and (up to two of) the tickets, watches its ticket, and sends
// nothing more while nothing changes.
func TestReviewBusySlotsOneListOneWatch(t *testing.T) {
	const k = 3
	f := newFakeAPI(t)
	f.holdAll(t, k)
	g := f.gate(t, Config{Slots: k, LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.watching(ctx, t, g)
	time.Sleep(500 * time.Millisecond)
	if n := f.requests(); n["create"] != 1 || n["list"] != 2 || n["watch"] != 1 || len(n) != 3 {
		t.Errorf("a waiting node sent %v, want one create, two lists and one watch", n)
	}
}
