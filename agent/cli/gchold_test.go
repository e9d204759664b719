package cli

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/presence"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// gcImages are three images the node's GC removes in the same pass.
var gcImages = []string{"docker.io/library/busybox:1.37", "docker.io/library/nginx:1.27", "registry.k8s.io/pause:3.10"}

// gcNode is a node whose image GC removes gcImages at each pass, with an
// agent pod on it; downloads counts what the pods pulled.
type gcNode struct {
	t         *testing.T
	e         *env
	a         *agent
	r         *removals
	ctx       context.Context
	present   map[string]bool
	downloads map[string]int
}

func newGCNode(t *testing.T) *gcNode {
	n := &gcNode{t: t, present: map[string]bool{}, downloads: map[string]int{}}
	n.e, n.a, n.r, n.ctx = newRemovals(t)
	for _, img := range gcImages {
		n.present[img] = true
	}
	n.startPod()
	return n
}

// startPod starts a new agent pod: its fetch and the first check of its
// watch, after reading the history back from the node annotation.
func (n *gcNode) startPod() {
	_, a, r, ctx := newRemovalsOn(n.t, n.e)
	n.a, n.r, n.ctx = a, r, ctx
	for _, img := range gcImages {
		a.entries = append(a.entries, imagelist.Entry{Ref: img, Normalized: img})
	}
	a.labeler.Removals = a.gcRemovals
	a.restoreGC(ctx)
	n.check(time.Now())
}

// check is a check as the puller runs it: a missing image is pulled
// unless held.
func (n *gcNode) check(start time.Time) {
	var results []pull.Result
	for _, img := range gcImages {
		res := pull.Result{Image: img, Normalized: img, Ref: img, ID: "sha256:" + img, Present: n.present[img]}
		if !res.Present && !n.a.holdGC(&res) {
			n.downloads[img]++
			n.present[img] = true
			res.Present, res.Pulled = true, true
		}
		results = append(results, res)
	}
	n.r.checked(n.ctx, results, start, nil)
}

// gcPass removes every image; the watcher reports only the first before
// the repair check runs (the others' events, or their CRI plugin, are
// late), then the rest, as the watcher of a running pod would.
func (n *gcNode) gcPass(podRunning bool) {
	for _, img := range gcImages {
		n.present[img] = false
	}
	if !podRunning {
		return
	}
	n.r.removed([]presence.Image{{Name: gcImages[0]}})
	n.check(time.Now())
	var late []presence.Image
	for _, img := range gcImages[1:] {
		late = append(late, presence.Image{Name: img})
	}
	n.r.removed(late)
	n.check(time.Now())
}

// Issue 48, "the GC hold does not hold", finding 7 and the Done when: over
// two GC passes of three images, with and without the agent's pod deleted
// between them, each image is downloaded again at most once in all.
// Before, the repair after the first removal pulled the other two back
// before their removals reached the guard, and a new pod started afresh.
func TestGCHoldOverTwoPasses(t *testing.T) {
	tests := []struct {
		name string
		// between: what happens between the passes.
		between func(n *gcNode) (podRunningAtPass2 bool)
	}{
		{"same pod", func(*gcNode) bool { return true }},
		{"pod deleted and recreated", func(n *gcNode) bool { n.startPod(); return true }},
		{"second pass while no pod runs", func(*gcNode) bool { return false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newGCNode(t)
			n.gcPass(true)
			running := tt.between(n)
			n.gcPass(running)
			if !running {
				n.startPod()
			}
			for range 2 {
				n.check(time.Now()) // the periodic checks
			}
			for _, img := range gcImages {
				if got := n.downloads[img]; got > 1 {
					t.Errorf("%s downloaded again %d times, want at most 1", img, got)
				}
			}
			_, s, _ := n.e.state()
			held := 0
			for _, f := range s.Failed {
				if f.Reason == pull.ReasonRemovedByGC {
					held++
				}
			}
			if held != len(gcImages) {
				t.Errorf("the label reports %d images RemovedByGC, want %d: %+v", held, len(gcImages), s.Failed)
			}
		})
	}
}

// Issue 48, finding 7: fetch, the init container, honours the holds the
// node annotation records: an image held back, or pulled back once and
// now missing, is not downloaded. Before, fetch pulled both.
func TestFetchHonoursGCHolds(t *testing.T) {
	const ref = "docker.io/library/app:1"
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		name      string
		removal   label.Removal
		wantPulls int
	}{
		{"held", label.Removal{Image: ref, Removals: 2, Holds: 1, Until: until, Gone: true}, 0},
		{"pulled back once, removed while no pod ran", label.Removal{Image: ref, Removals: 1, Repulled: true}, 0},
		{"removed once, not pulled back yet: repaired", label.Removal{Image: ref, Removals: 1, Gone: true}, 1},
		{"another list's image: no hold",
			label.Removal{Image: "docker.io/library/other:1", Removals: 2, Holds: 1, Until: until, Gone: true}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			s := label.NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
			o := label.NewOwner(testNamespace, testInstance)
			s.Owner, s.Removals = &o, []label.Removal{tt.removal}
			node := e.node(testNode)
			node.Labels[testKey] = "succeeded"
			node.Annotations[testKey] = s.Marshal()
			if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.run(e.agentArgs("fetch", ref)...)
			if n := len(e.cri.Pulls("")); n != tt.wantPulls {
				t.Errorf("%d pulls, want %d:\n%s", n, tt.wantPulls, e.logs)
			}
			_, got, _ := e.state()
			if carried := len(got.Removals) > 0; carried != (tt.removal.Image == ref) {
				t.Errorf("history carried on in fetch's annotation: %v, want it only for the list's images: %+v",
					carried, got.Removals)
			}
			if tt.wantPulls == 0 && (len(got.Failed) != 1 || got.Failed[0].Reason != pull.ReasonRemovedByGC) {
				t.Errorf("failed %+v, want %s RemovedByGC", got.Failed, ref)
			}
		})
	}
}
