package slots

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
)

func TestNewValidates(t *testing.T) {
	leases := fake.NewSimpleClientset().CoordinationV1().Leases("ns")
	good := Config{Client: leases, Namespace: "ns", Instance: "demo", Slots: 2, Identity: "pod"}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"zero slots", func(c *Config) { c.Slots = 0 }, "at least 1"},
		{"no identity", func(c *Config) { c.Identity = "" }, "POD_NAME"},
		// A negative SeedNodes made no slot eligible, ever (issue 50).
		{"negative seed nodes", func(c *Config) { c.SeedNodes = -1 }, "seed nodes"},
		{"no client", func(c *Config) { c.Client = nil }, "Lease client"},
		{"no namespace", func(c *Config) { c.Namespace = "" }, "namespace"},
		{"no instance", func(c *Config) { c.Instance = "" }, "instance"},
		{"negative lease duration", func(c *Config) { c.LeaseDuration = -time.Second }, "lease duration"},
		{"negative call timeout", func(c *Config) { c.CallTimeout = -time.Second }, "call timeout"},
		{"negative release grace", func(c *Config) { c.ReleaseGrace = -time.Second }, "release grace"},
		{"negative refusal span", func(c *Config) { c.RefusedFor = -time.Second }, "refusal span"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.change(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New: got %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	tests := []struct {
		name     string
		duration time.Duration
		want     time.Duration
	}{
		{"default", 0, DefaultLeaseDuration},
		{"whole seconds kept", 20 * time.Second, 20 * time.Second},
		{"rounded up", 2500 * time.Millisecond, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leases := fake.NewSimpleClientset().CoordinationV1().Leases("ns")
			g, err := New(Config{Client: leases, Namespace: "ns", Instance: "demo",
				Slots: 1, Identity: "pod", LeaseDuration: tt.duration})
			if err != nil {
				t.Fatal(err)
			}
			c := g.cfg
			if c.LeaseDuration != tt.want || c.CallTimeout != DefaultCallTimeout ||
				c.ReleaseGrace != DefaultReleaseGrace || c.RefusedFor != DefaultRefusedFor {
				t.Errorf("got duration %v call %v grace %v refused %v",
					c.LeaseDuration, c.CallTimeout, c.ReleaseGrace, c.RefusedFor)
			}
		})
	}
}

func TestHoldTakesDistinctSlotsUpToK(t *testing.T) {
	for _, k := range []int{1, 2, 3} {
		t.Run(SlotName("k", k), func(t *testing.T) {
			f := newFakeAPI(t)
			// Nothing expires in this test, so the (K+1)th holder cannot get in.
			g := f.gate(t, Config{Slots: k, LeaseDuration: time.Hour}, 0)
			taken := map[int]bool{}
			for range k {
				h := hold(t, g)
				if taken[h.Slot()] {
					t.Fatalf("slot %d handed out twice", h.Slot())
				}
				taken[h.Slot()] = true
				l := f.lease(t, h.Name())
				if holder(l) != h.id || !strings.HasPrefix(h.id, "pod-") {
					t.Errorf("%s: holder %q, want %q", h.Name(), holder(l), h.id)
				}
				if l.Labels[LabelInstance] != "demo" || l.Labels[LabelComponent] != "pull-slot" {
					t.Errorf("%s: labels %v", h.Name(), l.Labels)
				}
				if *l.Spec.LeaseDurationSeconds != 3600 {
					t.Errorf("%s: leaseDurationSeconds %d", h.Name(), *l.Spec.LeaseDurationSeconds)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if h, err := g.Hold(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("slot %d of %d: got holding %v, err %v; want to wait until the deadline", k+1, k, h, err)
			}
			if f.lease(t, SlotName("demo", k)) != nil {
				t.Errorf("a Lease beyond slot %d was created", k-1)
			}
		})
	}
}

func TestReleaseHandsSlotToWaiter(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1, LeaseDuration: time.Hour}, 0)
	a := hold(t, g)
	released := make(chan struct{})
	got := make(chan *Holding)
	go func() {
		h, err := g.Hold(context.Background())
		if err != nil {
			t.Error(err)
		}
		select {
		case <-released:
		default:
			t.Error("waiter got the slot before it was released")
		}
		got <- h
	}()
	close(released)
	a.Release()
	b := <-got
	defer b.Release()
	if l := f.lease(t, b.Name()); holder(l) != b.id || *l.Spec.LeaseTransitions != 1 {
		t.Errorf("after hand-over: holder %q transitions %d", holder(l), *l.Spec.LeaseTransitions)
	}
	b.Release()
	if l := f.lease(t, b.Name()); holder(l) != "" {
		t.Errorf("after release: holder %q, want none", holder(l))
	}
	a.Release() // a second Release is harmless
}

func TestCrashedHolderSlotIsTakenOverAfterDuration(t *testing.T) {
	const d = 300 * time.Millisecond
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1}, d)
	a := hold(t, g)
	crash(a)
	lastRenew := f.lease(t, a.Name()).Spec.RenewTime.Time

	b := hold(t, g)
	l := f.lease(t, b.Name())
	if holder(l) != b.id {
		t.Fatalf("holder %q, want %q", holder(l), b.id)
	}
	// A lower bound, not a timing assertion: taking over earlier would
	// be a bug however slow the machine is.
	if took := l.Spec.AcquireTime.Time; took.Sub(lastRenew) < d {
		t.Errorf("slot taken over %v after the last renewal, before the lease duration %v", took.Sub(lastRenew), d)
	}
}

func TestRenewalKeepsSlot(t *testing.T) {
	const d = 300 * time.Millisecond
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1}, d)
	a := hold(t, g)
	acquired := f.lease(t, a.Name()).Spec.AcquireTime.Time

	ctx, cancel := context.WithTimeout(context.Background(), 5*d)
	defer cancel()
	b, err := g.Hold(ctx)
	if err == nil {
		// Only acceptable if a starved machine made a miss its renewals, in
		// which case a must have stopped counting itself as holder.
		defer b.Release()
		if !lost(a) {
			t.Fatal("two holders count themselves as holding the only slot")
		}
		return
	}
	l := f.lease(t, a.Name())
	if holder(l) != a.id || !l.Spec.RenewTime.Time.After(acquired) {
		t.Errorf("holder %q renewTime %v acquired %v: want renewed by %q", holder(l), l.Spec.RenewTime, acquired, a.id)
	}
}

func TestLostRaceMovesOn(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 2, LeaseDuration: time.Hour}, 0)
	// Both slots exist and are free; every waiter starts at a random slot,
	// so make the other node win whichever slot is written first.
	for i := range 2 {
		f.labeledSlot(t, i)
	}
	other := "other-node"
	first := ""
	f.setHook(func(verb, name string, lease *coordinationv1.Lease) error {
		if verb != "update" || first != "" {
			return nil
		}
		first = name
		f.setHook(nil)
		f.sneak(t, name, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = &other })
		return nil
	})
	h := hold(t, g)
	if h.Name() == first {
		t.Fatalf("took %s, which another node won", first)
	}
	if got := holder(f.lease(t, first)); got != other {
		t.Errorf("%s holder %q, want %q", first, got, other)
	}
}

func TestRenewalSurvivesOtherWritesToLease(t *testing.T) {
	const d = 300 * time.Millisecond
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 1}, d)
	a := hold(t, g)
	f.write(t, a.Name(), func(l *coordinationv1.Lease) { l.Annotations = map[string]string{"note": "kept"} })
	before := f.lease(t, a.Name()).Spec.RenewTime.Time
	// Wait for a renewal on top of the changed Lease.
	for !f.lease(t, a.Name()).Spec.RenewTime.Time.After(before) {
		select {
		case <-a.Lost():
			t.Fatal("lost the slot")
		case <-time.After(10 * time.Millisecond):
		}
	}
	l := f.lease(t, a.Name())
	if holder(l) != a.id || l.Annotations["note"] != "kept" {
		t.Errorf("holder %q annotations %v", holder(l), l.Annotations)
	}
}

func TestSlotLost(t *testing.T) {
	const d = 300 * time.Millisecond
	tests := []struct {
		name string
		// interfere starts the trouble; it returns a hook for the fake.
		interfere func(t *testing.T, f *fakeAPI, h *Holding)
		// stillOurs: after the trouble ends, the Lease still names us, so
		// Release must clear it.
		stillOurs bool
	}{
		{
			name: "apiserver unreachable past the renew deadline",
			interfere: func(t *testing.T, f *fakeAPI, h *Holding) {
				f.setHook(func(verb, name string, _ *coordinationv1.Lease) error {
					return apierrors.NewServiceUnavailable("down for the test")
				})
			},
			stillOurs: true,
		},
		{
			name: "another node took the slot",
			interfere: func(t *testing.T, f *fakeAPI, h *Holding) {
				thief := "thief"
				f.write(t, h.Name(), func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = &thief })
			},
		},
		{
			name: "Lease deleted",
			interfere: func(t *testing.T, f *fakeAPI, h *Holding) {
				f.remove(t, h.Name())
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t)
			g := f.gate(t, Config{Slots: 1}, d)
			h := hold(t, g)
			tt.interfere(t, f, h)
			<-h.Lost()
			f.setHook(nil)
			h.Release()
			l := f.lease(t, h.Name())
			if tt.stillOurs && holder(l) != "" {
				t.Errorf("Release left holder %q", holder(l))
			}
			if !tt.stillOurs && l != nil && holder(l) == h.id {
				t.Errorf("Release wrote us back as holder")
			}
		})
	}
}

func TestAPIErrors(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	forbidden := apierrors.NewForbidden(gr, "demo-slot-0", errors.New("RBAC"))
	tests := []struct {
		name     string
		failures int // how many calls fail before the API recovers; -1 for ever
		err      error
		wantErr  bool
	}{
		{"transient errors are retried", 3, apierrors.NewInternalError(errors.New("etcd hiccup")), false},
		{"timeouts are retried", 2, apierrors.NewServerTimeout(leasesGVR.GroupResource(), "get", 1), false},
		{"forbidden for RefusedFor ends the wait", -1, forbidden, true},
		{"unauthorized for RefusedFor ends the wait", -1, apierrors.NewUnauthorized("no token"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t)
			g := f.gate(t, Config{Slots: 2, LeaseDuration: time.Hour, RefusedFor: 50 * time.Millisecond}, 0)
			n := 0
			f.setHook(func(string, string, *coordinationv1.Lease) error {
				if tt.failures >= 0 && n >= tt.failures {
					return nil
				}
				n++
				return tt.err
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h, err := g.Hold(ctx)
			if tt.wantErr {
				if err == nil || !errors.Is(err, tt.err) || errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("got %v, want %v at once", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Hold: %v", err)
			}
			h.Release()
		})
	}
}

func TestSeedMode(t *testing.T) {
	tests := []struct {
		name  string
		slots int
		seeds int
	}{
		{"one seed of three slots", 3, 1},
		{"two seeds of three slots", 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t)
			g := f.gate(t, Config{Slots: tt.slots, SeedNodes: tt.seeds, SeedKey: "list-1", LeaseDuration: time.Hour}, 0)
			var seeds []*Holding
			for range tt.seeds {
				h := hold(t, g)
				if !h.seed || h.Slot() >= tt.seeds {
					t.Fatalf("seed got slot %d seed=%v", h.Slot(), h.seed)
				}
				seeds = append(seeds, h)
			}
			// Free slots remain, but nobody else may pull yet.
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if h, err := g.Hold(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("non-seed got %v, %v while seeds pull", h, err)
			}
			got := make(chan *Holding, tt.slots)
			for range tt.slots - 1 {
				go func() {
					h, err := g.Hold(context.Background())
					if err != nil {
						t.Error(err)
					}
					got <- h
				}()
			}
			last := seeds[len(seeds)-1]
			last.Release()
			if v := f.lease(t, last.Name()).Annotations[SeededAnnotation]; v != "list-1" {
				t.Errorf("the seed's slot %s = %q, want list-1", SeededAnnotation, v)
			}
			// Now the remaining slots open up.
			for range tt.slots - 1 {
				h := <-got
				if h.seed {
					t.Errorf("%s taken after seeding counts as a seed", h.Name())
				}
				defer h.Release()
			}
		})
	}
}

func TestSeedKeyMustMatch(t *testing.T) {
	f := newFakeAPI(t)
	// An earlier image list was seeded; this one has not been.
	f.labeledSlot(t, 0)
	f.write(t, SlotName("demo", 0), func(l *coordinationv1.Lease) {
		l.Annotations = map[string]string{SeededAnnotation: "list-1"}
	})
	g := f.gate(t, Config{Slots: 2, SeedNodes: 1, SeedKey: "list-2", LeaseDuration: time.Hour}, 0)
	h := hold(t, g)
	if !h.seed || h.Slot() != 0 {
		t.Fatalf("got slot %d seed=%v, want seed on slot 0", h.Slot(), h.seed)
	}
	h.Release()
	if v := f.lease(t, h.Name()).Annotations[SeededAnnotation]; v != "list-2" {
		t.Errorf("seeded = %q, want list-2", v)
	}
}

func TestSeedsNotLimitedWhenSeedsCoverSlots(t *testing.T) {
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 2, SeedNodes: 5, LeaseDuration: time.Hour}, 0)
	a, b := hold(t, g), hold(t, g)
	if a.Slot() == b.Slot() || !a.seed || !b.seed {
		t.Fatalf("got slots %d, %d seeds %v, %v", a.Slot(), b.Slot(), a.seed, b.seed)
	}
}

// A seed records on its own slot, whichever it is: once any slot says
// so, a new node is no seed and may use any slot.
func TestSeededOnAnySlot(t *testing.T) {
	f := newFakeAPI(t)
	f.labeledSlot(t, 1)
	f.write(t, SlotName("demo", 1), func(l *coordinationv1.Lease) {
		l.Annotations = map[string]string{SeededAnnotation: "true"}
	})
	g := f.gate(t, Config{Slots: 2, SeedNodes: 1}, 0)
	a, b := hold(t, g), hold(t, g)
	if a.seed || b.seed {
		t.Errorf("nodes after seeding count as seeds: %v, %v", a.seed, b.seed)
	}
}

func TestCrashedSeedIsReplacedBySeed(t *testing.T) {
	const d = 300 * time.Millisecond
	f := newFakeAPI(t)
	g := f.gate(t, Config{Slots: 2, SeedNodes: 1}, d)
	a := hold(t, g)
	crash(a)
	b := hold(t, g)
	if b.Slot() != 0 || !b.seed {
		t.Fatalf("after a seed crashed: slot %d seed=%v, want the seed's slot as a seed", b.Slot(), b.seed)
	}
}
