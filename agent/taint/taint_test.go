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

func setup(label string, taints ...corev1.Taint) (*fake.Clientset, *Remover, *recorder, counter, *clock) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}}, Spec: corev1.NodeSpec{Taints: taints}}
	if label != "" {
		node.Labels[labelKey] = label
	}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{own}}}
	cs := fake.NewClientset(node, other)
	rec, cnt, clk := &recorder{}, counter{}, &clock{now: t0}
	r := &Remover{
		Nodes: cs.CoreV1().Nodes(), Node: "n1", Key: key, LabelKey: labelKey,
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
