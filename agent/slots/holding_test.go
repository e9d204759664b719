package slots

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hungRelease is the fake's Lease client, except that a write clearing
// the holder (a release) hangs until its context ends, as against an
// apiserver that takes connections and never answers.
type hungRelease struct {
	LeaseClient
	started chan struct{}
}

func (c hungRelease) Update(ctx context.Context, l *coordinationv1.Lease,
	opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.Spec.HolderIdentity != nil {
		return c.LeaseClient.Update(ctx, l, opts)
	}
	close(c.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

// Finding 5 of issue 27: once the context the slot was held with ends
// (SIGTERM), a release gets ReleaseGrace against a hung apiserver, a
// release already in flight included; before, it went on for its own
// timeouts (30 s). A release that can finish does.
func TestReleaseGrace(t *testing.T) {
	const grace = 50 * time.Millisecond
	tests := []struct {
		name string
		hung bool
		// endBefore ends the context before Release, else while it runs.
		endBefore bool
	}{
		{name: "terminated, then released against a hung API", hung: true, endBefore: true},
		{name: "terminated while a release is in flight", hung: true},
		{name: "terminated, API fine: released", endBefore: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t)
			client := hungRelease{LeaseClient: f.leases(), started: make(chan struct{})}
			cfg := Config{Slots: 1, LeaseDuration: time.Hour, ReleaseGrace: grace}
			if tt.hung {
				cfg.Client = client
			}
			g := f.gate(t, cfg, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			h, err := g.Hold(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tt.endBefore {
				cancel()
			}
			returned := make(chan time.Time)
			go func() {
				h.Release()
				returned <- time.Now()
			}()
			if !tt.endBefore {
				<-client.started
				cancel()
			}
			ended := time.Now()
			select {
			case at := <-returned:
				if tt.hung && at.Sub(ended) < grace {
					t.Errorf("Release gave up %v after the context ended, before its grace %v", at.Sub(ended), grace)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Release still runs 10s after the context ended (grace %v)", grace)
			}
			if l := f.lease(t, h.Name()); !tt.hung && holder(l) != "" {
				t.Errorf("holder %q after Release, want none", holder(l))
			}
		})
	}
}

// Issue 26 item 9: a seed whose run was cut short (SIGTERM) or whose slot
// was lost has not finished: it does not record that seeding is done, so
// the other nodes do not start without a warm mirror. Its slot is given
// back, and the next node to take a seed slot is a seed.
func TestCutShortSeedRecordsNothing(t *testing.T) {
	for _, how := range []string{"terminated", "slot lost"} {
		t.Run(how, func(t *testing.T) {
			f := newFakeAPI(t)
			g := f.gate(t, Config{Slots: 2, SeedNodes: 1, SeedKey: "list-1"}, 300*time.Millisecond)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			h, err := g.Hold(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !h.seed {
				t.Fatal("the first node is no seed")
			}
			switch how {
			case "terminated":
				cancel()
			case "slot lost":
				f.setHook(func(string, string, *coordinationv1.Lease) error {
					return apierrors.NewServiceUnavailable("down for the test")
				})
				<-h.Lost()
				f.setHook(nil)
			}
			h.Release()
			l := f.lease(t, SlotName("demo", 0))
			if v, ok := l.Annotations[SeededAnnotation]; ok {
				t.Errorf("a seed %s before its pull ended recorded %s=%q", how, SeededAnnotation, v)
			}
			if holder(l) != "" {
				t.Errorf("slot 0 still held by %q", holder(l))
			}
			if next := hold(t, g); !next.seed {
				t.Errorf("the next node took %s as no seed", next.Name())
			}
		})
	}
}
