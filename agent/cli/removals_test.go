package cli

import (
	"context"
	"log/slog"
	"strings"
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
	e, _, r, ctx := newRemovals(t)

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

// An image removed again after watch pulled it back is one the node's GC
// keeps removing: the label says RemovedByGC, and the next checks do not
// pull it while the hold lasts. A one-off removal is repaired.
func TestRemovalsStopFightingTheGC(t *testing.T) {
	e, a, r, ctx := newRemovals(t)
	const app = "docker.io/library/app:1"
	result := func(present, pulled bool) []pull.Result {
		res := pull.Result{Image: "app:1", Normalized: app, Ref: app, Present: present, Pulled: pulled, ID: "sha256:a"}
		if !present && a.holdGC(&res) {
			return []pull.Result{res}
		}
		if !present {
			t.Fatal("a check would pull app:1 again")
		}
		return []pull.Result{res}
	}
	reason := func() string {
		t.Helper()
		v, s, _ := e.state()
		if v == "succeeded" {
			return ""
		}
		if len(s.Failed) != 1 {
			t.Fatalf("label %s, failures %v", v, s.Failed)
		}
		return s.Failed[0].Reason
	}

	before := time.Now()
	r.checked(ctx, result(true, false), before, nil)
	// GC pass 1: a removal, repaired once.
	r.removed([]presence.Image{{Name: app}})
	if got := reason(); got != pull.ReasonRemoved {
		t.Fatalf("first removal: %q, want Removed", got)
	}
	// A check that looked before the removal does not make the repair's
	// check count it a second time.
	r.checked(ctx, result(true, false), before, nil)
	if missing := (pull.Result{Normalized: app}); a.holdGC(&missing) {
		t.Fatal("the repair's check held app:1 back after one removal")
	}
	if recs := a.guard.Records(); len(recs) != 1 || recs[0].Removals != 1 {
		t.Errorf("history %+v, want one removal of app:1", recs)
	}
	r.checked(ctx, result(true, true), time.Now(), nil)
	if got := reason(); got != "" {
		t.Fatalf("after the repair: %q, want succeeded", got)
	}
	// A runtime wiped while down is a one-off: repaired.
	r.removed([]presence.Image{{Name: app, AfterRestart: true}})
	if got := reason(); got != pull.ReasonRemoved {
		t.Fatalf("wipe: %q, want Removed", got)
	}
	// The repair's check finds it missing: still a one-off.
	if missing := (pull.Result{Normalized: app}); a.holdGC(&missing) {
		t.Fatal("the repair's check held app:1 back after a wipe")
	}
	r.checked(ctx, result(true, true), time.Now(), nil)
	// GC pass 2: removed again after the re-pull; held back.
	r.removed([]presence.Image{{Name: app}})
	if got := reason(); got != pull.ReasonRemovedByGC {
		t.Fatalf("second removal: %q, want RemovedByGC", got)
	}
	// The repair check and the periodic ones do not pull it.
	for range 2 {
		r.checked(ctx, result(false, false), time.Now(), nil)
		if got := reason(); got != pull.ReasonRemovedByGC {
			t.Fatalf("check while held: %q, want RemovedByGC", got)
		}
	}
	_, s, _ := e.state()
	if msg := s.Failed[0].Message; !strings.Contains(msg, "image GC keeps removing") || !strings.Contains(msg, "pinning") {
		t.Errorf("message %q does not say why and what would keep it", msg)
	}
}

// newRemovals is an agent labeling the fake node, with its removals
// tracker; ctx ends with the test.
func newRemovals(t *testing.T) (*env, *agent, *removals, context.Context) {
	return newRemovalsOn(t, newEnv(t))
}

// newRemovalsOn is newRemovals on e's node: another pod of the agent.
func newRemovalsOn(t *testing.T, e *env) (*env, *agent, *removals, context.Context) {
	owner := label.NewOwner(testNamespace, testInstance)
	log := slog.New(slog.DiscardHandler)
	a := &agent{log: log, events: &events.Recorder{Log: log},
		labeler: &label.Labeler{Nodes: clientset.Wrap(e.kube).Nodes(), Node: testNode, Key: testKey, Owner: &owner, Log: log}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &removals{a: a, ctx: ctx, repair: make(chan struct{}, 1), gone: map[string]time.Time{},
		watcher: &presence.Watcher{Log: log}}
	a.removals = r
	return e, a, r, ctx
}
