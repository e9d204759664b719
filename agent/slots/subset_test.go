package slots

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8stesting "k8s.io/client-go/testing"
)

// subsetWaiter is a watchWaiter of a K-slot gate, outside any Hold.
func subsetWaiter(t *testing.T, cfg Config) *watchWaiter {
	t.Helper()
	g := newFakeAPI(t).gate(t, cfg, 0)
	// Its window of 1 s is sized for watching all slots.
	w := &watchWaiter{waiter: g.newWaiter(), window: time.Second, size: cfg.Slots, scaledFor: cfg.Slots, index: map[string]int{}, since: map[string]time.Time{}}
	for i := range cfg.Slots {
		w.names = append(w.names, SlotName(cfg.Instance, i))
		w.index[w.names[i]] = i
		w.since[w.names[i]] = time.Now()
	}
	return w
}

// firstSubsetWaiter is subsetWaiter with the size and window a new Hold
// starts with (firstSubset).
func firstSubsetWaiter(t *testing.T, cfg Config) *watchWaiter {
	t.Helper()
	w := subsetWaiter(t, cfg)
	w.size, w.window = w.g.firstSubset()
	w.scaledFor = w.size
	return w
}

// heldSlots are k slot Leases, each held and carrying its index label.
func heldSlots(k int) map[string]*coordinationv1.Lease {
	leases := map[string]*coordinationv1.Lease{}
	for i := range k {
		l := &coordinationv1.Lease{}
		l.Name, l.ResourceVersion = SlotName("demo", i), "v"+strconv.Itoa(i)
		l.Labels = map[string]string{LabelInstance: "demo", LabelComponent: LabelComponentSlot, LabelSlot: strconv.Itoa(i)}
		other := "other-" + strconv.Itoa(i)
		l.Spec.HolderIdentity = &other
		leases[l.Name] = l
	}
	return leases
}

// slotValues are the slot indexes a watch selector picks, nil for all.
func slotValues(t *testing.T, sel string) []int {
	t.Helper()
	parsed, err := labels.Parse(sel)
	if err != nil {
		t.Fatalf("selector %q: %v", sel, err)
	}
	reqs, _ := parsed.Requirements()
	for _, r := range reqs {
		if r.Key() != LabelSlot {
			continue
		}
		var out []int
		for _, v := range r.Values().UnsortedList() {
			i, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("selector %q: slot %q", sel, v)
			}
			out = append(out, i)
		}
		slices.Sort(out)
		return out
	}
	return nil
}

func TestChooseWatched(t *testing.T) {
	const k = 6
	tests := []struct {
		name string
		cfg  Config
		size int
		// change alters the listed Leases; unchanged were first seen at
		// their current version an hour ago; denied are refused slots.
		change    func(map[string]*coordinationv1.Lease)
		unchanged []int
		denied    []int
		// wantAll: the watch follows every slot. Otherwise must are in the
		// subset, and its size is within [minLen, maxLen].
		wantAll        bool
		must           []int
		minLen, maxLen int
		// first: the first list of the wait. mustOne: at least one of
		// these is in the subset.
		first   bool
		mustOne []int
	}{
		{name: "while seeding, the seed slot joins", cfg: Config{SeedNodes: 1}, size: 2, must: []int{0}, minLen: 2, maxLen: 3},
		{name: "size K", size: k, wantAll: true},
		{name: "a Lease without the index label", size: 2, wantAll: true,
			change: func(m map[string]*coordinationv1.Lease) { delete(m[SlotName("demo", 3)].Labels, LabelSlot) }},
		{name: "subset", size: 2, minLen: 2, maxLen: 2},
		{name: "free and absent slots join", size: 2, must: []int{3, 5}, minLen: 2, maxLen: 4,
			change: func(m map[string]*coordinationv1.Lease) {
				m[SlotName("demo", 3)].Spec.HolderIdentity = nil
				delete(m, SlotName("demo", 5))
			}},
		{name: "the first list adds no stale slot, and a free one only if it has none", size: 2, minLen: 2, maxLen: 3, first: true, unchanged: []int{4},
			mustOne: []int{3, 5},
			change: func(m map[string]*coordinationv1.Lease) {
				m[SlotName("demo", 3)].Spec.HolderIdentity = nil
				delete(m, SlotName("demo", 5))
			}},
		{name: "a node joining a quiet cluster watches a free slot", size: 2, minLen: 2, maxLen: 3, first: true, must: []int{3},
			change: func(m map[string]*coordinationv1.Lease) { m[SlotName("demo", 3)].Spec.HolderIdentity = nil }},
		{name: "a slot unchanged for its duration joins", size: 2, must: []int{4}, minLen: 2, maxLen: 3, unchanged: []int{4}},
		{name: "refused slots never", size: 2, denied: []int{1, 2, 3, 4, 5}, must: []int{0}, minLen: 1, maxLen: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Slots, cfg.Instance = k, "demo"
			w := subsetWaiter(t, cfg)
			w.size = tt.size
			for _, i := range tt.denied {
				w.denied[i] = true
			}
			for _, i := range tt.unchanged {
				w.since[w.names[i]] = time.Now().Add(-time.Hour)
			}
			listed := heldSlots(k)
			if tt.change != nil {
				tt.change(listed)
			}
			sel := w.chooseWatched(listed, time.Now(), !tt.first)
			got := slotValues(t, sel.String())
			if tt.wantAll {
				if got != nil || w.watched != nil {
					t.Fatalf("watching %v (selector %q), want all", w.watched, sel)
				}
				return
			}
			if !slices.Equal(got, slices.Sorted(maps.Keys(w.watched))) {
				t.Errorf("selector %q, watched %v", sel, w.watched)
			}
			if len(got) < tt.minLen || len(got) > tt.maxLen {
				t.Errorf("watching %v, want %d to %d slots", got, tt.minLen, tt.maxLen)
			}
			for _, i := range tt.must {
				if !slices.Contains(got, i) {
					t.Errorf("watching %v, want slot %d among them", got, i)
				}
			}
			if len(tt.mustOne) > 0 && !slices.ContainsFunc(tt.mustOne, func(i int) bool { return slices.Contains(got, i) }) {
				t.Errorf("watching %v, want one of %v among them", got, tt.mustOne)
			}
			for _, i := range tt.denied {
				if slices.Contains(got, i) {
					t.Errorf("watching refused slot %d", i)
				}
			}
			// The window follows: watchers per slot scale with the subset.
			// While seeding it stays: the seed slots are all there is.
			want := time.Second * time.Duration(len(got)) / k
			if tt.cfg.SeedNodes > 0 {
				want = time.Second
			}
			if w.window != want {
				t.Errorf("window %v after watching %d of %d slots, want %v", w.window, len(got), k, want)
			}
		})
	}
}

func TestWantSize(t *testing.T) {
	// perSlot estimates ln2 × window / target watchers per slot; the target
	// is targetDelay here.
	window := func(perSlot float64) time.Duration {
		return time.Duration(perSlot / 0.6931471805599453 * float64(targetDelay))
	}
	tests := []struct {
		name      string
		slots     int
		size      int
		takesSeen int
		perSlot   float64
		want      int
	}{
		{"too few takes seen to judge", 10, 10, settleTakes - 1, 1000, 10},
		{"a window still growing", 10, 10, -settleTakes, 1000, 10},
		{"within the band", 10, 4, settleTakes, watchersPerSlot, 4},
		{"a large herd on all slots", 10, 10, settleTakes, 1000, minSubset},
		{"a few hundred on all slots stay", 10, 10, settleTakes, watchAllBelow - 50, 10},
		{"a large herd, K=50", 50, 50, settleTakes, 1000, minSubset},
		{"many per slot, but few slots watched", 50, 2, settleTakes, 100, minSubset},
		{"a lost race's doubled window changes nothing", 50, 2, settleTakes, 4 * watchersPerSlot, 2},
		{"nor a window half as wide as the others'", 50, 4, settleTakes, watchersPerSlot/4 + 0.5, 4},
		{"a shrinking herd widens", 10, 2, settleTakes, 4.5, 9},
		{"down to all slots", 10, 5, settleTakes, 2, 10},
		{"already all", 10, 10, settleTakes, 1, 10},
		{"one slot", 1, 1, settleTakes, 1000, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := subsetWaiter(t, Config{Slots: tt.slots, Instance: "demo"})
			w.size, w.takesSeen, w.window = tt.size, tt.takesSeen, window(tt.perSlot)
			w.widened, w.narrowed = 1, 1
			if tt.takesSeen < 0 { // all early
				w.takesSeen, w.widened, w.narrowed = -tt.takesSeen, -tt.takesSeen, 0
			}
			if tt.size < tt.slots {
				w.watched = map[int]bool{}
				for i := range tt.size {
					w.watched[i] = true
				}
			}
			if got := w.wantSize(); got != tt.want {
				t.Errorf("wantSize %d, want %d", got, tt.want)
			}
		})
	}
}

// With a known herd, the takes seen tell how many still wait: a waiter of
// two slots among 50 counts each take it sees as 25 nodes gone.
func TestWantSizeCountsTakes(t *testing.T) {
	tests := []struct {
		name     string
		herdLeft float64
		watching int
		want     int
	}{
		{"the whole herd waits", 1000, 2, 2},
		{"a quarter of it: still 10 per slot", 250, 2, 2},
		{"a fifth: 8 per slot, widen to 20", 200, 2, 5},
		{"a tenth: 4 per slot, widen to 20", 100, 2, 10},
		{"all gone by the count", -25, 2, 50},
		{"a widened subset holds", 100, 10, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := subsetWaiter(t, Config{Slots: 50, Instance: "demo", Herd: 1000})
			w.size, w.herdLeft = tt.watching, tt.herdLeft
			w.watched = map[int]bool{}
			for i := range tt.watching {
				w.watched[i] = true
			}
			if got := w.wantSize(); got != tt.want {
				t.Errorf("wantSize %d, want %d", got, tt.want)
			}
		})
	}
	// Every take seen counts.
	w := subsetWaiter(t, Config{Slots: 50, Instance: "demo", Herd: 1000})
	w.size, w.herdLeft, w.watched = 2, 1000, map[int]bool{0: true, 1: true}
	w.leases = map[string]*coordinationv1.Lease{}
	w.freeSince, w.lostAt, w.outside = map[string]time.Time{}, map[string]string{}, map[int]bool{}
	a, b := "a", "b"
	prev := &coordinationv1.Lease{}
	prev.Name, prev.Spec.HolderIdentity = SlotName("demo", 0), &a
	cur := prev.DeepCopy()
	cur.Spec.HolderIdentity = &b
	w.steer(prev, cur, time.Now())
	if w.herdLeft != 975 {
		t.Errorf("herd left %v after one take seen on 2 of 50 slots, want 975", w.herdLeft)
	}
}

// watchSelectors are the label selectors of the watches made so far.
func (f *fakeAPI) watchSelectors() []string {
	var out []string
	for _, a := range f.cs.Actions() {
		if wa, ok := a.(k8stesting.WatchAction); ok {
			if r := wa.GetWatchRestrictions(); r.Labels != nil {
				out = append(out, r.Labels.String())
			}
		}
	}
	return out
}

// A waiter whose window says that many waiters share the slots lists
// again and watches a few of them; a slot freed outside those is not seen
// until the next list, which adds it because it is free.
func TestLargeHerdWatchesASubset(t *testing.T) {
	const k = 10
	f := newFakeAPI(t)
	for name, l := range heldSlots(k) {
		f.write(t, name, func(n *coordinationv1.Lease) { n.Labels, n.Spec = l.Labels, l.Spec })
	}
	g := f.gate(t, Config{Slots: k, LeaseDuration: time.Hour}, 0)
	// A window of many waiters: 60 s at a 70 ms target is about 600 per
	// slot.
	g.firstWindow = time.Minute
	g.resubsetSpread = time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := waiters(ctx, t, g, 1)
	time.Sleep(100 * time.Millisecond)
	// Others hand slots over. The slot is never seen
	// free, so that the waiter cannot take it.
	takes := 0
	handOver := func(i int) {
		name := SlotName("demo", i)
		takes++
		f.write(t, name, func(l *coordinationv1.Lease) {
			next := "next-" + strconv.Itoa(takes)
			l.Spec.HolderIdentity = &next
			delay := targetDelay / 2 // early and late in turn: the window holds
			if i%2 == 1 {
				delay = 2 * targetDelay
			}
			l.Annotations = map[string]string{TakeDelayAnnotation: delay.String()}
		})
	}
	var subset []int
	for round := 0; subset == nil && round < 10; round++ {
		for i := range k {
			handOver(i)
		}
		time.Sleep(50 * time.Millisecond)
		sels := f.watchSelectors()
		subset = slotValues(t, sels[len(sels)-1])
	}
	if len(subset) < minSubset || len(subset) >= k {
		t.Fatalf("watching %v after many hand-overs, want a subset of %d or more", subset, minSubset)
	}
	var outside int
	for i := range k {
		if !slices.Contains(subset, i) {
			outside = i
			break
		}
	}
	name := SlotName("demo", outside)
	f.write(t, name, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })
	lists := f.listCount()
	f.endWatches()
	h := <-got
	defer h.Release()
	if h.Name() != name {
		t.Errorf("took %s, want the freed %s", h.Name(), name)
	}
	if f.listCount() <= lists {
		t.Errorf("took a slot it does not watch without listing again")
	}
}

// A waiter that knows the herd starts with the subset and window the herd
// would steer it to; one that does not starts with all slots.
func TestFirstSubset(t *testing.T) {
	perSlot := func(n float64) time.Duration { return time.Duration(n * float64(targetDelay) / 0.6931471805599453) }
	tests := []struct {
		name       string
		slots      int
		herd       int
		wantSize   int
		wantWindow time.Duration
	}{
		{"herd unknown", 10, 0, 10, initialWindow},
		{"1,000 nodes, K=10", 10, 1000, minSubset, perSlot(200)},
		{"1,000 nodes, K=50", 50, 1000, minSubset, perSlot(40)},
		{"500 nodes, K=10", 10, 500, minSubset, perSlot(100)},
		{"300 nodes, K=10: all slots", 10, 300, 10, perSlot(300)},
		{"40 nodes, K=10: all slots", 10, 40, 10, perSlot(40)},
		{"12 nodes, K=10: all slots", 10, 12, 10, perSlot(12)},
		{"one slot", 1, 1000, 1, perSlot(1000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newFakeAPI(t).gate(t, Config{Slots: tt.slots, Herd: tt.herd}, 0)
			g.firstWindow = initialWindow
			size, window := g.firstSubset()
			if size != tt.wantSize || (window-tt.wantWindow).Abs() > time.Millisecond {
				t.Errorf("first subset %d, window %v; want %d, %v", size, window, tt.wantSize, tt.wantWindow)
			}
		})
	}
}

// The first window of a known herd is sized for its first subset
// (firstSubset): the first list keeps it, and only a later subset of
// another size scales it.
func TestFirstListKeepsTheFirstSubsetsWindow(t *testing.T) {
	const k = 50
	w := firstSubsetWaiter(t, Config{Slots: k, Instance: "demo", Herd: 1000, LeaseDuration: time.Hour})
	first := w.window
	w.chooseWatched(heldSlots(k), time.Now(), false)
	if len(w.watched) != w.size || w.window != first {
		t.Fatalf("first list: watching %d slots with window %v, want %d with the first subset's window %v", len(w.watched), w.window, w.size, first)
	}
	w.size = 2 * w.size
	w.chooseWatched(heldSlots(k), time.Now(), true)
	if want := 2 * first; len(w.watched) != w.size || w.window != want {
		t.Errorf("relist for twice the slots: watching %d with window %v, want %d with %v", len(w.watched), w.window, w.size, want)
	}
}

// While seeding, a waiter of a large herd watches its subset and the seed
// slot, with the first subset's window; when seeding ends it races for
// its subset at once, with the window scaled to the slots it watches.
func TestSeedingWatchesTheSubsetAndTheSeedSlot(t *testing.T) {
	const k = 10
	w := firstSubsetWaiter(t, Config{Slots: k, Instance: "demo", Herd: 1000, SeedNodes: 1, LeaseDuration: time.Hour})
	first := w.window
	w.leases = map[string]*coordinationv1.Lease{}
	w.chooseWatched(w.leases, time.Now(), false)
	if free, _ := w.free(time.Now()); w.seeded || !w.watched[0] || len(w.watched) > w.size+1 || w.window != first || !slices.Equal(free, []int{0}) {
		t.Fatalf("seeding: seeded %v, watching %v, window %v, free %v; want the first subset and slot 0, window %v, only slot 0 free", w.seeded, w.watched, w.window, free, first)
	}
	seed := &coordinationv1.Lease{}
	seed.Name = w.names[0]
	seed.Annotations = map[string]string{SeededAnnotation: "true"}
	w.leases[seed.Name] = seed
	free, _ := w.free(time.Now())
	if want := first * time.Duration(len(w.watched)) / time.Duration(w.size); !w.seeded || w.window != want {
		t.Errorf("seeding over: seeded %v, window %v; want %v, for the %d slots watched", w.seeded, w.window, want, len(w.watched))
	}
	if len(free) != len(w.watched) {
		t.Errorf("seeding over: free %v, want every watched slot %v", free, w.watched)
	}
}

// With F slots free, a waiter draws from a window F times narrower: the
// racers split over the free slots. A not-yet-made slot splits the window
// only in a known herd, whose window is sized per slot.
func TestDrawWindowSplitsOverFreeSlots(t *testing.T) {
	tests := []struct {
		name       string
		herd       int
		made, free int // free slots, of which the first made exist
		want       time.Duration
	}{
		{"one free", 1000, 1, 1, time.Second},
		{"four free", 1000, 4, 4, time.Second / 4},
		{"four free, none made, herd known", 1000, 0, 4, time.Second / 4},
		{"four free, one made, herd unknown", 0, 1, 4, time.Second},
		{"none made, herd unknown", 0, 0, 4, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := subsetWaiter(t, Config{Slots: 6, Instance: "demo", Herd: tt.herd})
			w.leases = map[string]*coordinationv1.Lease{}
			var free []int
			for i := range tt.free {
				free = append(free, i)
				if i < tt.made {
					l := &coordinationv1.Lease{}
					l.Name = w.names[i]
					w.leases[l.Name] = l
				}
			}
			if got := w.drawWindow(free); got != tt.want {
				t.Errorf("drawWindow = %v, want %v", got, tt.want)
			}
		})
	}
}

// A relist that shows a slot at a new version starts its free time anew:
// the delay a take reports must not count the time the slot spent out of
// this waiter's sight.
func TestRelistRestartsFreeTimeOfChangedSlots(t *testing.T) {
	f := newFakeAPI(t)
	for name, l := range heldSlots(2) {
		f.write(t, name, func(n *coordinationv1.Lease) { n.Labels, n.Spec = l.Labels, l.Spec })
	}
	g := f.gate(t, Config{Slots: 2, Instance: "demo", LeaseDuration: time.Hour}, 0)
	w := &watchWaiter{waiter: g.newWaiter(), window: time.Second, size: 2, index: map[string]int{},
		lostAt: map[string]string{}, freeSince: map[string]time.Time{}, outside: map[int]bool{}}
	for i := range 2 {
		w.names = append(w.names, SlotName("demo", i))
		w.index[w.names[i]] = i
	}
	stream, err := w.list(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Stop()
	// Both slots are freed out of sight; the waiter knew one free long ago,
	// and at the version the next list shows for the other.
	free := func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }
	f.write(t, w.names[0], free)
	f.write(t, w.names[1], free)
	long := time.Now().Add(-time.Hour)
	w.freeSince[w.names[0]] = long
	w.freeSince[w.names[1]] = long
	w.leases[w.names[1]] = f.lease(t, w.names[1])
	stream, err = w.list(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Stop()
	if got := w.freeSince[w.names[0]]; !got.After(long) {
		t.Errorf("slot freed out of sight: free since %v, want from the relist on", got)
	}
	if got := w.freeSince[w.names[1]]; !got.Equal(long) {
		t.Errorf("slot seen free at this version before: free since %v, want %v kept", got, long)
	}
}
