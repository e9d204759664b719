package label

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
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
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "n1", nil)
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

// A restarted apiserver refuses (403, 401) until its caches are filled:
// refusals are retried for RefusedFor, then given up.
func TestApplyRetriesRefusalsForAWhile(t *testing.T) {
	for _, tt := range []struct {
		name    string
		refusal error
	}{
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", fmt.Errorf("RBAC: not found"))},
		{"unauthorized", apierrors.NewUnauthorized("invalid bearer token")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientset(nodes()...)
			calls, refusals := 0, 3
			c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				if calls <= refusals {
					return true, nil, tt.refusal
				}
				return false, nil, nil
			})
			l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Sleep: func(time.Duration) {}}
			if err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now())); err != nil || calls != refusals+1 {
				t.Errorf("restarted apiserver: err %v after %d calls, want success after %d", err, calls, refusals+1)
			}
			calls, refusals = 0, 1<<30
			l.RefusedFor, l.Sleep = 20*time.Millisecond, func(time.Duration) { time.Sleep(5 * time.Millisecond) }
			err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now()))
			if err == nil || !errors.Is(err, tt.refusal) || calls < 2 || calls > 20 {
				t.Errorf("refused for good: err %v after %d calls, want the refusal after a few", err, calls)
			}
		})
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

// hungNodes is an API server that never answers a patch: each Patch
// blocks until its context ends, the way client-go's REST client returns
// when the request's context is done.
type hungNodes struct {
	kube.NodeClient
	mu        sync.Mutex
	calls     int
	deadlines []time.Time
	arrived   chan struct{}
}

func (h *hungNodes) Patch(ctx context.Context, name string, _ types.PatchType, _ []byte, _ metav1.PatchOptions, _ ...string) (*corev1.Node, error) {
	h.mu.Lock()
	h.calls++
	dl, _ := ctx.Deadline()
	h.deadlines = append(h.deadlines, dl)
	h.mu.Unlock()
	select {
	case h.arrived <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, fmt.Errorf("Patch \"https://10.96.0.1/api/v1/nodes/%s\": %w", name, ctx.Err())
}

func TestCancellation(t *testing.T) {
	s := NewSummary(1, 1, nil, time.Second, time.Now())
	tests := []struct {
		name string
		// run calls the labeler and returns its error and the number of
		// patches the API server saw.
		run       func(t *testing.T) (error, int)
		wantErr   error
		wantText  string
		wantCalls int
	}{
		{
			name: "already cancelled: no attempt",
			run: func(t *testing.T) (error, int) {
				c := fake.NewClientset(nodes()...)
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Sleep: func(time.Duration) { t.Error("slept after cancel") }}
				err := l.Remove(ctx, time.Minute)
				return err, len(c.Actions())
			},
			wantErr: context.Canceled, wantCalls: 0,
		},
		{
			name: "cancelled between retries: no further attempt",
			run: func(t *testing.T) (error, int) {
				c := fake.NewClientset(nodes()...)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("down")
				})
				l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Sleep: func(time.Duration) { cancel() }}
				err := l.Apply(ctx, s)
				return err, len(c.Actions())
			},
			wantText: "stopped retrying", wantCalls: 1,
		},
		{
			// AttemptTimeout is long: an attempt that ignored the
			// cancellation would end with DeadlineExceeded, not Canceled.
			name: "cancelled while an attempt is in flight: the attempt ends",
			run: func(t *testing.T) (error, int) {
				h := &hungNodes{arrived: make(chan struct{}, 1)}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() {
					<-h.arrived
					cancel()
				}()
				l := &Labeler{Nodes: h, Node: "n1", Key: key, AttemptTimeout: 30 * time.Second, Sleep: func(time.Duration) { t.Error("slept after cancel") }}
				err := l.Apply(ctx, s)
				return err, h.calls
			},
			wantErr: context.Canceled, wantCalls: 1,
		},
		{
			// The budget and the attempt timeout are long; the caller's
			// deadline is what bounds the removal on SIGTERM.
			name: "caller's deadline bounds a removal against a hung server",
			run: func(t *testing.T) (error, int) {
				h := &hungNodes{arrived: make(chan struct{}, 1)}
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				want, _ := ctx.Deadline()
				l := &Labeler{Nodes: h, Node: "n1", Key: key, AttemptTimeout: 30 * time.Second, Sleep: func(time.Duration) { t.Error("slept past the deadline") }}
				err := l.Remove(ctx, time.Minute)
				for i, dl := range h.deadlines {
					if dl.IsZero() || dl.After(want) {
						t.Errorf("attempt %d has deadline %v, after the caller's %v", i+1, dl, want)
					}
				}
				return err, h.calls
			},
			wantErr: context.DeadlineExceeded, wantCalls: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err, calls := tt.run(t)
			if err == nil {
				t.Fatal("no error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v does not wrap %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q lacks %q", err, tt.wantText)
			}
			if calls != tt.wantCalls {
				t.Errorf("%d patch calls, want %d", calls, tt.wantCalls)
			}
			if !strings.Contains(err.Error(), "patch node n1") {
				t.Errorf("error %q does not name the node", err)
			}
		})
	}
}

func TestSummaryCutsMessagesOnRuneBoundary(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want string
	}{
		{"short", "not found", "not found"},
		{"at the limit", strings.Repeat("m", maxMessage), strings.Repeat("m", maxMessage)},
		{"ascii", strings.Repeat("m", maxMessage+1), strings.Repeat("m", maxMessage) + "..."},
		// A three-byte rune starting one byte before the limit would be
		// split by a byte cut.
		{"rune across the limit", strings.Repeat("m", maxMessage-1) + "€€", strings.Repeat("m", maxMessage-1) + "..."},
		{"rune ending at the limit", strings.Repeat("m", maxMessage-3) + "€€", strings.Repeat("m", maxMessage-3) + "€..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSummary(1, 0, []Failure{{Image: "x:1", Reason: "PullFailed", Message: tt.msg}}, time.Second, time.Now())
			got := s.Failed[0].Message
			if got != tt.want {
				t.Errorf("got %q (%d bytes), want %q", got, len(got), tt.want)
			}
			if !utf8.ValidString(got) {
				t.Error("invalid UTF-8")
			}
			back, err := Parse(s.Marshal())
			if err != nil || back.Failed[0].Message != got {
				t.Errorf("round trip changed the message: %v", err)
			}
		})
	}
}
