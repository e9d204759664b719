package cli

import (
	"bytes"
	"cmp"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

const (
	testNode      = "node-a"
	testInstance  = "demo"
	testKey       = "image-prefetcher.stackrox.io/demo"
	testNamespace = "prefetch"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	t      *testing.T
	cri    *fakecri.Server
	kube   *fake.Clientset
	stdout *syncBuffer
	logs   *syncBuffer
	sleeps []time.Duration
	mu     sync.Mutex
	ready  chan struct{}
	getenv map[string]string
	// namespaceFile is the service-account namespace file ("" for none).
	namespaceFile string
}

// newEnv starts a fake CRI and a fake API server holding one node that
// already carries unrelated labels and annotations.
func newEnv(t *testing.T) *env {
	t.Helper()
	s, err := fakecri.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        testNode,
		Labels:      map[string]string{"kubernetes.io/hostname": testNode, "image-prefetcher.stackrox.io/other": "failed"},
		Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "image-prefetcher.stackrox.io/other": "{}"},
	}}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b", Labels: map[string]string{"x": "y"}}}
	return &env{t: t, cri: s, kube: fake.NewClientset(node, other), stdout: &syncBuffer{}, logs: &syncBuffer{}, ready: make(chan struct{}), getenv: map[string]string{}}
}

func (e *env) deps() Deps {
	return Deps{
		Kube: func(string) (kube.Interface, error) { return clientset.Wrap(e.kube), nil },
		Sleep: func(ctx context.Context, d time.Duration) error {
			e.mu.Lock()
			e.sleeps = append(e.sleeps, d)
			e.mu.Unlock()
			return ctx.Err()
		},
		LabelSleep:    func(time.Duration) {},
		Ready:         func() { close(e.ready) },
		Getenv:        func(k string) string { return e.getenv[k] },
		NamespaceFile: cmp.Or(e.namespaceFile, filepath.Join(e.t.TempDir(), "no-such-file")),
		Stdout:        e.stdout,
		Stderr:        e.logs,
	}
}

// run executes the command line and returns the exit code.
func (e *env) run(args ...string) int {
	e.t.Helper()
	return Execute(context.Background(), args, e.deps())
}

func (e *env) agentArgs(sub string, extra ...string) []string {
	args := []string{sub, "--cri-socket=" + e.cri.Socket, "--node-name=" + testNode, "--instance=" + testInstance, "--namespace=" + testNamespace,
		"--log-level=debug", "--initial-pull-attempt-timeout=5s"}
	return append(args, extra...)
}

func (e *env) node(name string) *corev1.Node {
	e.t.Helper()
	n, err := e.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// state returns this instance's label and parsed annotation.
func (e *env) state() (string, label.Summary, bool) {
	e.t.Helper()
	n := e.node(testNode)
	v, ok := n.Labels[testKey]
	a, aok := n.Annotations[testKey]
	if !ok || !aok {
		return v, label.Summary{}, false
	}
	s, err := label.Parse(a)
	if err != nil {
		e.t.Fatalf("annotation %q: %v", a, err)
	}
	return v, s, true
}

// assertOthersUntouched checks that nothing but this instance's key changed.
func (e *env) assertOthersUntouched() {
	e.t.Helper()
	n := e.node(testNode)
	for k, want := range map[string]string{"kubernetes.io/hostname": testNode, "image-prefetcher.stackrox.io/other": "failed"} {
		if n.Labels[k] != want {
			e.t.Errorf("label %s = %q, want %q", k, n.Labels[k], want)
		}
	}
	for k, want := range map[string]string{"node.alpha.kubernetes.io/ttl": "0", "image-prefetcher.stackrox.io/other": "{}"} {
		if n.Annotations[k] != want {
			e.t.Errorf("annotation %s = %q, want %q", k, n.Annotations[k], want)
		}
	}
	for k := range n.Labels {
		if strings.HasPrefix(k, "image-prefetcher.stackrox.io/") && k != testKey && k != "image-prefetcher.stackrox.io/other" {
			e.t.Errorf("unexpected label %s", k)
		}
	}
	b := e.node("node-b")
	if len(b.Labels) != 1 || b.Labels["x"] != "y" || len(b.Annotations) != 0 {
		e.t.Errorf("node-b changed: labels %v annotations %v", b.Labels, b.Annotations)
	}
}

// waitFor polls cond until it holds; the test's own timeout bounds it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
