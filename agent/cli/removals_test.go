package cli

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/presence"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// A removal turns the label failed (Removed) at once and asks for a check;
// a check that looked before the removal does not turn it back.
func TestRemovalsKeepTheLabelTruthful(t *testing.T) {
	e := newEnv(t)
	owner := label.NewOwner(testNamespace, testInstance)
	log := slog.New(slog.DiscardHandler)
	a := &agent{log: log, events: &events.Recorder{Log: log},
		labeler: &label.Labeler{Nodes: clientset.Wrap(e.kube).Nodes(), Node: testNode, Key: testKey, Owner: &owner, Log: log}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &removals{a: a, ctx: ctx, repair: make(chan struct{}, 1), gone: map[string]time.Time{},
		watcher: &presence.Watcher{Log: log}}

	present := func() []pull.Result {
		return []pull.Result{
			{Image: "app:1", Normalized: "docker.io/library/app:1", Ref: "docker.io/library/app:1", Present: true, ID: "sha256:a"},
			{Image: "db:2", Normalized: "docker.io/library/db:2", Ref: "docker.io/library/db:2", Present: true, ID: "sha256:d"},
		}
	}
	expect := func(what, value string, removed ...string) {
		t.Helper()
		v, s, ok := e.state()
		if !ok || v != value {
			t.Fatalf("%s: label %q, want %q", what, v, value)
		}
		var got []string
		for _, f := range s.Failed {
			if f.Reason != pull.ReasonRemoved {
				t.Errorf("%s: %s failed with %s, want Removed", what, f.Image, f.Reason)
			}
			got = append(got, f.Image)
		}
		if len(got) != len(removed) || len(got) > 0 && got[0] != removed[0] {
			t.Errorf("%s: failed %v, want %v", what, got, removed)
		}
	}
	repairAsked := func() bool {
		select {
		case <-r.repair:
			return true
		default:
			return false
		}
	}

	before := time.Now()
	r.checked(ctx, present(), before, nil)
	expect("first check", "succeeded")

	r.removed([]presence.Image{{Name: "docker.io/library/app:1"}})
	expect("removal", "failed", "app:1")
	if !repairAsked() {
		t.Error("a removal did not ask for a check")
	}

	// A check that began before the removal still saw app:1.
	r.checked(ctx, present(), before, nil)
	expect("check that looked before the removal", "failed", "app:1")

	// The repair check looked after it, and found it pulled again.
	r.checked(ctx, present(), time.Now(), nil)
	expect("repair", "succeeded")
	if len(r.gone) != 0 {
		t.Errorf("still marked gone: %v", r.gone)
	}
}
