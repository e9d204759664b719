package slots

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	k8stesting "k8s.io/client-go/testing"
)

// watchedSlots is the slots named by the last watch's LabelSlot
// requirement; nil when it watches every slot.
func (f *fakeAPI) watchedSlots(t *testing.T) []int {
	t.Helper()
	var last k8stesting.WatchAction
	for _, a := range f.cs.Actions() {
		if w, ok := a.(k8stesting.WatchAction); ok {
			last = w
		}
	}
	if last == nil {
		t.Fatal("no watch")
	}
	reqs, _ := last.GetWatchRestrictions().Labels.Requirements()
	for _, r := range reqs {
		if r.Key() != LabelSlot {
			continue
		}
		var got []int
		for _, v := range r.Values().List() {
			i, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("slot label value %q", v)
			}
			got = append(got, i)
		}
		slices.Sort(got)
		return got
	}
	return nil
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
	return held
}

// watching starts one waiter of g and returns what it takes and the slots
// its first watch follows (nil: all).
func (f *fakeAPI) watching(ctx context.Context, t *testing.T, g *Gate) (<-chan *Holding, []int) {
	t.Helper()
	f.cs.ClearActions()
	got := waiters(ctx, t, g, 1)
	for f.requests()["watch"] < 1 {
		time.Sleep(time.Millisecond)
	}
	return got, f.watchedSlots(t)
}

// A waiter of a large herd watches a group of the slots, not all of them,
// so that each take and release reaches a fraction of the herd. It watches
// them all when the herd is small, and when a slot Lease was made by an
// older agent (which does not label the index). While seeding it watches
// slot 0 too, where the seed that finishes says so.
func TestLargeHerdWatchesAGroup(t *testing.T) {
	for _, tc := range []struct {
		name           string
		k, herd, seeds int
		unlabeled      bool
		watched        int // slots watched, 0 for all
	}{
		{name: "herd of 1,000, 8 slots", k: 8, herd: 1000, watched: 1},
		{name: "herd of 1,000, 32 slots", k: 32, herd: 1000, watched: 2},
		{name: "herd of 199", k: 8, herd: 199},
		{name: "unknown herd", k: 8},
		{name: "a Lease made by an older agent", k: 8, herd: 1000, unlabeled: true},
		{name: "seeding", k: 16, herd: 1000, seeds: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.holdAll(t, tc.k)
			if tc.unlabeled {
				f.write(t, SlotName("demo", 3), func(l *coordinationv1.Lease) { delete(l.Labels, LabelSlot) })
			}
			g := f.gate(t, Config{Slots: tc.k, SeedNodes: tc.seeds, Herd: tc.herd, LeaseDuration: time.Hour}, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, got := f.watching(ctx, t, g)
			switch {
			case tc.seeds > 0:
				if len(got) == 0 || got[0] != 0 || len(got) > 2 {
					t.Errorf("watches slots %v, want slot 0 and its group of one", got)
				}
			case tc.watched == 0 && got != nil:
				t.Errorf("watches slots %v, want all", got)
			case tc.watched > 0 && len(got) != tc.watched:
				t.Errorf("watches slots %v, want %d of them", got, tc.watched)
			}
		})
	}
}

// A waiter whose group stays busy for quietFor lists again and watches
// every slot, so that it takes a slot freed in another group: the herd
// there may have left.
func TestBusyGroupWatchesAllSlots(t *testing.T) {
	const k = 8
	f := newFakeAPI(t)
	held := f.holdAll(t, k)
	g := f.gate(t, Config{Slots: k, Herd: 1000, LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*quietFor)
	defer cancel()
	got, group := f.watching(ctx, t, g)
	if len(group) != 1 {
		t.Fatalf("watches slots %v, want one", group)
	}
	other := (group[0] + 1) % k
	held[other].Release()
	select {
	case h := <-got:
		defer h.Release()
		if h.Slot() != other {
			t.Errorf("took slot %d, want %d", h.Slot(), other)
		}
		if n := f.requests()["list"]; n != 2 {
			t.Errorf("%d lists, want 2: the first, and one to watch all slots", n)
		}
	case <-ctx.Done():
		t.Fatalf("slot %d free for %s, and the waiter watching slot %d did not take it", other, 3*quietFor, group[0])
	}
}

// A waiter that has seen its group's herd drain, by the takes it saw, to
// fewer than watchAllBelow left in the whole herd watches every slot: the
// groups drain alike, and one that empties first leaves its slots idle.
func TestDrainedGroupWatchesAllSlots(t *testing.T) {
	const k, herd = 2, 2 * watchAllBelow // two groups of one slot
	f := newFakeAPI(t)
	f.holdAll(t, k)
	g := f.gate(t, Config{Slots: k, Herd: herd, LeaseDuration: time.Hour}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, group := f.watching(ctx, t, g)
	if len(group) != 1 {
		t.Fatalf("watches slots %v, want one", group)
	}
	// Other nodes take the slot in turn: each take is one node fewer.
	takes := (herd-watchAllBelow)/k + 1
	for n := range takes {
		if got := f.requests()["list"]; got != 1 {
			t.Fatalf("listed again after %d takes, want after %d", n, takes)
		}
		f.write(t, SlotName("demo", group[0]), func(l *coordinationv1.Lease) {
			id := fmt.Sprintf("other-%d", n)
			l.Spec.HolderIdentity = &id
		})
	}
	// Well before quietFor, after which a busy group watches all slots too.
	for deadline := time.Now().Add(quietFor / 2); f.requests()["watch"] < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still watching slots %v after the group's herd left", group)
		}
	}
	if got := f.watchedSlots(t); got != nil {
		t.Errorf("watches slots %v after the group's herd left, want all", got)
	}
}
