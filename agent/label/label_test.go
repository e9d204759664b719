package label

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
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

const key = "image-prefetcher.stackrox.io/demo"

func nodes() []runtime.Object {
	return []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
			Labels:      map[string]string{"kubernetes.io/os": "linux", "image-prefetcher.stackrox.io/other": "succeeded"},
			Annotations: map[string]string{"a": "b", "image-prefetcher.stackrox.io/other": `{"total":1}`}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"kubernetes.io/os": "linux"}}},
	}
}

func get(t *testing.T, c *fake.Clientset, name string) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestApplyAndRemoveTouchOnlyOwnKey(t *testing.T) {
	c := fake.NewClientset(nodes()...)
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key}
	s := NewSummary(3, 2, []Failure{{Image: "x:1", Reason: "NotFound", Message: "not found"}}, 1500*time.Millisecond, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err := l.Apply(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	n := get(t, c, "n1")
	wantLabels := map[string]string{"kubernetes.io/os": "linux", "image-prefetcher.stackrox.io/other": "succeeded", key: "failed"}
	if !reflect.DeepEqual(n.Labels, wantLabels) {
		t.Errorf("labels %v, want %v", n.Labels, wantLabels)
	}
	wantAnn := `{"total":3,"present":2,"failed":[{"image":"x:1","reason":"NotFound","message":"not found"}],"durationSeconds":1.5,"completedAt":"2026-01-02T03:04:05Z"}`
	if n.Annotations[key] != wantAnn || n.Annotations["a"] != "b" || n.Annotations["image-prefetcher.stackrox.io/other"] != `{"total":1}` || len(n.Annotations) != 3 {
		t.Errorf("annotations %v", n.Annotations)
	}
	if n2 := get(t, c, "n2"); len(n2.Labels) != 1 || len(n2.Annotations) != 0 {
		t.Errorf("other node changed: %v %v", n2.Labels, n2.Annotations)
	}
	// Exactly one merge patch on n1 holding only this key.
	var patches []k8stesting.PatchAction
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			patches = append(patches, p)
		}
	}
	if len(patches) != 1 || patches[0].GetName() != "n1" || string(patches[0].GetPatchType()) != "application/merge-patch+json" {
		t.Fatalf("patches %v", patches)
	}
	var body map[string]map[string]map[string]any
	if err := json.Unmarshal(patches[0].GetPatch(), &body); err != nil {
		t.Fatal(err)
	}
	if len(body) != 1 || len(body["metadata"]) != 2 || len(body["metadata"]["labels"]) != 1 || len(body["metadata"]["annotations"]) != 1 {
		t.Errorf("patch %s touches more than the instance key", patches[0].GetPatch())
	}

	if err := l.Remove(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	n = get(t, c, "n1")
	delete(wantLabels, key)
	if !reflect.DeepEqual(n.Labels, wantLabels) || len(n.Annotations) != 2 || n.Annotations["a"] != "b" {
		t.Errorf("after remove: labels %v annotations %v", n.Labels, n.Annotations)
	}
}

func TestApplyRetriesTransientErrors(t *testing.T) {
	c := fake.NewClientset(nodes()...)
	fails := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		fails++
		switch fails {
		case 1:
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		case 2:
			return true, nil, apierrors.NewTooManyRequests("slow down", 1)
		case 3:
			return true, nil, fmt.Errorf("dial tcp 10.96.0.1:443: connect: connection refused")
		}
		return false, nil, nil
	})
	var waits []time.Duration
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Sleep: func(d time.Duration) { waits = append(waits, d) }}
	if err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now())); err != nil {
		t.Fatal(err)
	}
	if get(t, c, "n1").Labels[key] != "succeeded" {
		t.Error("label not written")
	}
	if len(waits) != 3 || waits[1] <= waits[0]*3/4 {
		t.Errorf("waits %v: want three growing waits", waits)
	}
}

func TestApplyGivesUpOnPermanentErrors(t *testing.T) {
	c := fake.NewClientset(nodes()...)
	calls := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", fmt.Errorf("denied"))
	})
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Sleep: func(time.Duration) {}}
	if err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now())); err == nil || calls != 1 {
		t.Errorf("err %v after %d calls", err, calls)
	}
	l.Node = "missing"
	c2 := fake.NewClientset()
	l.Nodes = c2.CoreV1().Nodes()
	if err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now())); err == nil || !apierrors.IsNotFound(err) {
		t.Errorf("missing node: %v", err)
	}
}

func TestApplyStopsAfterRetryBudget(t *testing.T) {
	c := fake.NewClientset(nodes()...)
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(fmt.Errorf("boom"))
	})
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, RetryFor: time.Nanosecond, Sleep: func(time.Duration) {}}
	if err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now())); err == nil || !strings.Contains(err.Error(), "still failing") {
		t.Errorf("err %v", err)
	}
}

func TestSummaryCapsFailures(t *testing.T) {
	var fs []Failure
	for i := range 25 {
		fs = append(fs, Failure{Image: fmt.Sprintf("img%d", i), Reason: "NotFound", Message: strings.Repeat("m", 600)})
	}
	s := NewSummary(30, 5, fs, time.Second, time.Now())
	if len(s.Failed) != MaxFailures || s.OmittedFailures != 5 || s.FailureCount() != 25 || s.Value() != "failed" {
		t.Errorf("%d listed, %d omitted, value %s", len(s.Failed), s.OmittedFailures, s.Value())
	}
	if len(s.Failed[0].Message) > maxMessage+3 {
		t.Errorf("message not truncated: %d", len(s.Failed[0].Message))
	}
	m := s.Marshal()
	if !strings.Contains(m, `"omittedFailures":5`) {
		t.Errorf("%s", m)
	}
	ok := NewSummary(2, 2, nil, time.Second, time.Now())
	if ok.Value() != "succeeded" || strings.Contains(ok.Marshal(), "omittedFailures") || !strings.Contains(ok.Marshal(), `"failed":[]`) {
		t.Errorf("%s %s", ok.Value(), ok.Marshal())
	}
	back, err := Parse(s.Marshal())
	if err != nil || !back.Same(s) {
		t.Errorf("round trip: %v", err)
	}
	if empty := NewSummary(0, 0, nil, 0, time.Now()); empty.Value() != "succeeded" {
		t.Error("an empty list is trivially succeeded")
	}
}

func TestCancelledContextGetsOneFreshAttemptAndNoRetries(t *testing.T) {
	c := fake.NewClientset(nodes()...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The attempt is still made, on a fresh context.
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Sleep: func(time.Duration) { t.Error("slept after cancel") }}
	if err := l.Remove(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	calls := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	if err := l.Apply(ctx, NewSummary(1, 1, nil, time.Second, time.Now())); err == nil || calls != 1 {
		t.Errorf("err %v after %d calls, want one attempt then a stop", err, calls)
	}
}
