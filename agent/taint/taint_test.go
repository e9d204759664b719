package taint

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

const (
	key      = "startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"
	labelKey = "image-prefetcher.stackrox.io/demo"
)

var (
	own     = corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule}
	ownExec = corev1.Taint{Key: key, Value: "x", Effect: corev1.TaintEffectNoExecute}
	other   = corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
)

type event struct{ typ, reason, msg string }

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) Emit(_ context.Context, typ, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{typ, reason, msg})
}

type counter map[string]int

func (c counter) StartupTaintRemoved(reason string) { c[reason]++ }

// clock is a fake clock that Sleep advances.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return nil
}

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// owner, pod and list are the instance and run of the Remover setup makes.
var owner = label.NewOwner("prefetch", "demo")

const (
	pod  = "uid-of-this-pod"
	list = "0123456789abcdef"
)

// written is the annotation this pod's run writes with a check's outcome.
func written(present int) string {
	s := label.NewSummary(1, present, nil, time.Second, t0)
	s.Owner, s.Pod, s.List = &owner, pod, list
	return s.Marshal()
}

// setup makes node n1 with the taints, and, unless value is "", the
// instance's key as this pod's run writes it; and n2, tainted too.
func setup(value string, taints ...corev1.Taint) (*fake.Clientset, *Remover, *recorder, counter, *clock) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}, Annotations: map[string]string{}}, Spec: corev1.NodeSpec{Taints: taints}}
	if value != "" {
		node.Labels[labelKey] = value
		node.Annotations[labelKey] = written(map[string]int{"succeeded": 1}[value])
	}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{own}}}
	cs := fake.NewClientset(node, other)
	rec, cnt, clk := &recorder{}, counter{}, &clock{now: t0}
	r := &Remover{
		Nodes: cs.CoreV1().Nodes(), Node: "n1", Key: key,
		Domain: "image-prefetcher.stackrox.io", LabelKey: labelKey, Owner: owner, Pod: pod, List: list,
		MaxWait: 20 * time.Minute, Started: t0, Events: rec, Metrics: cnt,
		Now: clk.Now, Sleep: clk.Sleep,
	}
	return cs, r, rec, cnt, clk
}

func taintsOf(t *testing.T, cs *fake.Clientset, name string) []corev1.Taint {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Taints
}

func patches(cs *fake.Clientset) []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func TestStep(t *testing.T) {
	for _, tc := range []struct {
		name       string
		label      string
		taints     []corev1.Taint
		elapsed    time.Duration
		maxWait    time.Duration
		wantDone   bool
		wantTaints []corev1.Taint
		wantEvent  string
	}{
		{"no taint: left alone", "", []corev1.Taint{other}, 0, 20 * time.Minute, true, []corev1.Taint{other}, ""},
		{"images missing, before maxWait: kept", "failed", []corev1.Taint{own, other}, 19 * time.Minute, 20 * time.Minute, false, []corev1.Taint{own, other}, ""},
		{"no label yet: kept", "", []corev1.Taint{own}, time.Minute, 20 * time.Minute, false, []corev1.Taint{own}, ""},
		{"succeeded: every taint with the key goes, others stay", "succeeded", []corev1.Taint{own, other, ownExec}, time.Minute, 20 * time.Minute, true, []corev1.Taint{other}, ReasonRemoved},
		{"succeeded: the only taint goes", "succeeded", []corev1.Taint{own}, 0, 0, true, nil, ReasonRemoved},
		{"maxWait passed: removed anyway", "failed", []corev1.Taint{own, other}, 20 * time.Minute, 20 * time.Minute, true, []corev1.Taint{other}, ReasonTimeout},
		{"maxWait 0: kept for good", "failed", []corev1.Taint{own}, 1000 * time.Hour, 0, false, []corev1.Taint{own}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, r, rec, cnt, clk := setup(tc.label, tc.taints...)
			r.MaxWait = tc.maxWait
			clk.now = t0.Add(tc.elapsed)
			done, err := r.Step(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if done != tc.wantDone {
				t.Errorf("done %v, want %v", done, tc.wantDone)
			}
			if got := taintsOf(t, cs, "n1"); !reflect.DeepEqual(got, tc.wantTaints) {
				t.Errorf("taints %v, want %v", got, tc.wantTaints)
			}
			if got := taintsOf(t, cs, "n2"); !reflect.DeepEqual(got, []corev1.Taint{own}) {
				t.Errorf("the other node's taints changed: %v", got)
			}
			switch {
			case tc.wantEvent == "" && (len(rec.events) > 0 || len(cnt) > 0):
				t.Errorf("events %v, metric %v; want none", rec.events, cnt)
			case tc.wantEvent != "":
				wantType := corev1.EventTypeNormal
				if tc.wantEvent == ReasonTimeout {
					wantType = corev1.EventTypeWarning
				}
				if len(rec.events) != 1 || rec.events[0].reason != tc.wantEvent || rec.events[0].typ != wantType {
					t.Errorf("events %v, want one %s %s", rec.events, wantType, tc.wantEvent)
				}
				if len(cnt) != 1 || cnt[tc.wantEvent] != 1 {
					t.Errorf("metric %v, want %s once", cnt, tc.wantEvent)
				}
			}
			ps := patches(cs)
			if reflect.DeepEqual(tc.wantTaints, tc.taints) {
				if len(ps) != 0 {
					t.Errorf("patches %v, want none", ps)
				}
				return
			}
			if len(ps) != 1 || ps[0].GetPatchType() != "application/json-patch+json" || ps[0].GetName() != "n1" {
				t.Fatalf("patches %v, want one JSON patch of n1", ps)
			}
		})
	}
}

// Only this pod's run counts: its own check (Done), or the succeeded it
// wrote for its list. A succeeded written by another owner (the same name
// in another namespace), by an earlier pod, or for another list is not
// this run's, and the taint stays until maxWait.
func TestStepTrustsOnlyThisRun(t *testing.T) {
	other := label.NewOwner("team-b", "demo")
	for _, tc := range []struct {
		name     string
		ann      func(s *label.Summary)
		done     bool
		wantGone bool
	}{
		{"this pod wrote succeeded for its list", func(*label.Summary) {}, false, true},
		{"written by another owner", func(s *label.Summary) { s.Owner = &other }, false, false},
		{"written by an earlier pod", func(s *label.Summary) { s.Pod = "uid-of-the-old-pod" }, false, false},
		{"written for another list", func(s *label.Summary) { s.List = "fedcba9876543210" }, false, false},
		{"written without a pod", func(s *label.Summary) { s.Pod = "" }, false, false},
		{"no key on the node, but this process's check found every image", nil, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, r, rec, _, _ := setup("", own)
			if tc.ann != nil {
				s := label.NewSummary(1, 1, nil, time.Second, t0)
				s.Owner, s.Pod, s.List = &owner, pod, list
				tc.ann(&s)
				n, _ := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
				n.Labels[labelKey], n.Annotations[labelKey] = "succeeded", s.Marshal()
				if _, err := cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			r.Done(tc.done)
			done, err := r.Step(context.Background())
			if err != nil || done != tc.wantGone || Has(mustNode(t, cs), key) == tc.wantGone {
				t.Errorf("done %v (err %v), taints %v; want removed %v", done, err, taintsOf(t, cs, "n1"), tc.wantGone)
			}
			if tc.wantGone && (len(rec.events) != 1 || rec.events[0].reason != ReasonRemoved) {
				t.Errorf("events %v", rec.events)
			}
		})
	}
}

// Instances that share the key each register on the node in their own
// key's annotation: the taint goes once every holder is done or past its
// deadline, at this instance's own success or its maxWait alike.
func TestStepWaitsForTheOtherHolders(t *testing.T) {
	const otherKey = "image-prefetcher.stackrox.io/other"
	holder := func(value, deadline, taintKey string) func(n *corev1.Node) {
		return func(n *corev1.Node) {
			o := label.NewOwner("prefetch", "other")
			s := label.NewSummary(1, 0, []label.Failure{{Image: "x", Reason: "Missing"}}, 0, t0)
			s.Owner, s.StartupTaint, s.StartupTaintDeadline = &o, taintKey, deadline
			n.Labels[otherKey], n.Annotations[otherKey] = value, s.Marshal()
		}
	}
	later, earlier := t0.Add(time.Hour).Format(time.RFC3339), t0.Add(-time.Minute).Format(time.RFC3339)
	for _, tc := range []struct {
		name     string
		other    func(n *corev1.Node)
		done     bool
		elapsed  time.Duration
		wantGone bool
	}{
		{"the other still pulls", holder("failed", later, key), true, 0, false},
		{"the other is done", holder("succeeded", later, key), true, 0, true},
		{"the other is past its deadline", holder("failed", earlier, key), true, 0, true},
		{"the other waits for its images (maxWait 0)", holder("failed", "", key), true, 0, false},
		{"the other holds another key", holder("failed", later, "example.com/other"), true, 0, true},
		{"this one's maxWait passed, the other still pulls", holder("failed", later, key), false, 20 * time.Minute, false},
		{"both past their deadlines", holder("failed", t0.Add(10*time.Minute).Format(time.RFC3339), key), false, 20 * time.Minute, true},
		{"a same-name owner of this key holds it too", func(n *corev1.Node) {
			o := label.NewOwner("team-b", "demo")
			s := label.NewSummary(1, 0, nil, 0, t0)
			s.Owner, s.StartupTaint, s.StartupTaintDeadline = &o, key, later
			n.Labels[labelKey], n.Annotations[labelKey] = "failed", s.Marshal()
		}, true, 0, false},
		{"an annotation that is not a summary", func(n *corev1.Node) { n.Annotations[otherKey] = "{" + key }, true, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, r, _, _, clk := setup("", own)
			n := mustNode(t, cs)
			tc.other(n)
			if _, err := cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			r.Done(tc.done)
			clk.now = t0.Add(tc.elapsed)
			done, err := r.Step(context.Background())
			if err != nil || done != tc.wantGone || Has(mustNode(t, cs), key) == tc.wantGone {
				t.Errorf("done %v (err %v), taints %v; want removed %v", done, err, taintsOf(t, cs, "n1"), tc.wantGone)
			}
		})
	}
}

func mustNode(t *testing.T, cs *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPatchTestsTheListItRead(t *testing.T) {
	b, err := Patch([]corev1.Taint{own, other}, key)
	if err != nil {
		t.Fatal(err)
	}
	var ops []map[string]any
	if err := json.Unmarshal(b, &ops); err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[0]["op"] != "test" || ops[0]["path"] != "/spec/taints" || ops[1]["op"] != "replace" {
		t.Fatalf("ops %s", b)
	}
	if n := len(ops[0]["value"].([]any)); n != 2 {
		t.Errorf("test value has %d taints, want the 2 read", n)
	}
	if v := ops[1]["value"].([]any); len(v) != 1 || v[0].(map[string]any)["key"] != "dedicated" {
		t.Errorf("replace value %v", v)
	}
	b, _ = Patch([]corev1.Taint{own}, key)
	if err := json.Unmarshal(b, &ops); err != nil || len(ops) != 2 || ops[1]["op"] != "remove" {
		t.Errorf("the last taint is removed with a remove op: %s", b)
	}
}

// A taint another controller adds between the read and the patch makes the
// apiserver's "test" fail with 422; the remover reads the node again and
// keeps the new taint.
func TestRemoveRereadsWhenTaintsChanged(t *testing.T) {
	cs, r, _, _, _ := setup("succeeded", own, other)
	added := corev1.Taint{Key: "node.kubernetes.io/network-unavailable", Effect: corev1.TaintEffectNoSchedule}
	first := true
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !first {
			return false, nil, nil
		}
		first = false
		n, err := cs.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", "n1")
		if err != nil {
			return true, nil, err
		}
		node := n.(*corev1.Node)
		node.Spec.Taints = append(node.Spec.Taints, added)
		if err := cs.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, node, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewGenericServerResponse(422, "patch", schema.GroupResource{Resource: "nodes"}, "n1", "the test operation failed", 0, false)
	})
	done, err := r.Step(context.Background())
	if err != nil || !done {
		t.Fatalf("done %v, err %v", done, err)
	}
	if got, want := taintsOf(t, cs, "n1"), []corev1.Taint{other, added}; !reflect.DeepEqual(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
	if n := len(patches(cs)); n != 2 {
		t.Errorf("%d patches, want 2", n)
	}
}

func TestRemoveRetriesTransientErrorsOnly(t *testing.T) {
	t.Run("transient", func(t *testing.T) {
		cs, r, _, _, _ := setup("succeeded", own)
		fails := 2
		cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			if fails == 0 {
				return false, nil, nil
			}
			fails--
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		})
		if done, err := r.Step(context.Background()); err != nil || !done {
			t.Fatalf("done %v, err %v", done, err)
		}
		if got := taintsOf(t, cs, "n1"); len(got) != 0 {
			t.Errorf("taints %v", got)
		}
	})
	t.Run("forbidden", func(t *testing.T) {
		cs, r, rec, _, _ := setup("succeeded", own)
		cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("denied by ValidatingAdmissionPolicy"))
		})
		done, err := r.Step(context.Background())
		if err == nil || done || !apierrors.IsForbidden(errors.Unwrap(err)) {
			t.Fatalf("done %v, err %v; want a forbidden error", done, err)
		}
		if n := len(patches(cs)); n != 1 {
			t.Errorf("%d patches, want 1: forbidden is not retried", n)
		}
		if len(rec.events) != 0 {
			t.Errorf("events %v", rec.events)
		}
	})
}

// Run polls while the label says failed and removes the taint exactly at
// maxWait, not a poll later.
func TestRunRemovesAtMaxWait(t *testing.T) {
	cs, r, rec, _, clk := setup("failed", own)
	r.MaxWait = 12 * time.Second
	r.Poll = 5 * time.Second
	r.Run(context.Background())
	if got := taintsOf(t, cs, "n1"); len(got) != 0 {
		t.Errorf("taints %v", got)
	}
	if got := clk.Now().Sub(t0); got != 12*time.Second {
		t.Errorf("removed %s after the pod started, want exactly maxWait", got)
	}
	if len(rec.events) != 1 || rec.events[0].reason != ReasonTimeout {
		t.Errorf("events %v", rec.events)
	}
}

// Run stops once the taint is gone, whoever removed it, and never adds it.
func TestRunStopsWhenTaintGone(t *testing.T) {
	cs, r, rec, _, _ := setup("failed", own)
	r.MaxWait = 0
	steps := 0
	r.Sleep = func(ctx context.Context, d time.Duration) error {
		steps++
		if steps == 3 {
			if _, err := cs.CoreV1().Nodes().Patch(ctx, "n1", "application/merge-patch+json", []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	}
	r.Run(context.Background())
	if steps != 3 {
		t.Errorf("Run slept %d times, want 3", steps)
	}
	if got := taintsOf(t, cs, "n1"); len(got) != 0 {
		t.Errorf("taints %v", got)
	}
	if len(rec.events) != 0 {
		t.Errorf("events %v", rec.events)
	}
}

func TestStartedAtSurvivesRestarts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pod-started-at")
	first, err := StartedAt(file, t0)
	if err != nil || !first.Equal(t0) {
		t.Fatalf("first: %v %v", first, err)
	}
	again, err := StartedAt(file, t0.Add(time.Hour))
	if err != nil || !again.Equal(t0) {
		t.Errorf("after a restart: %v %v, want %v", again, err, t0)
	}
	if err := os.WriteFile(file, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(2 * time.Hour)
	if got, err := StartedAt(file, now); err == nil || !got.Equal(now) {
		t.Errorf("unreadable record: %v %v, want now and an error", got, err)
	}
	if got, err := StartedAt("", now); err != nil || !got.Equal(now) {
		t.Errorf("no file: %v %v", got, err)
	}
}
