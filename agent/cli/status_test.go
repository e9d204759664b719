package cli

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func statusEnv(t *testing.T) *env {
	e := newEnv(t)
	ok := `{"total":2,"present":2,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z"}`
	bad := `{"total":2,"present":1,"failed":[{"image":"typo:1","reason":"NotFound","message":"not found"}],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z"}`
	mk := func(name string, labels, ann map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ann}}
	}
	e.kube = fake.NewClientset(
		mk("n1", map[string]string{"pool": "a", "image-prefetcher.stackrox.io/web": "succeeded", "image-prefetcher.stackrox.io/db": "succeeded"},
			map[string]string{"image-prefetcher.stackrox.io/web": ok, "image-prefetcher.stackrox.io/db": ok, "keep": "me"}),
		mk("n2", map[string]string{"pool": "b", "image-prefetcher.stackrox.io/web": "failed"},
			map[string]string{"image-prefetcher.stackrox.io/web": bad}),
	)
	return e
}

func TestStatusTable(t *testing.T) {
	e := statusEnv(t)
	if code := e.run("status"); code != ExitError {
		t.Errorf("exit %d, want 1: n2 is failed and lacks db", code)
	}
	want := `NODE  INSTANCE  STATE      PRESENT  FAILURES
n1    db        succeeded  2/2      -
n1    web       succeeded  2/2      -
n2    db        missing    -        -
n2    web       failed     1/2      typo:1 (NotFound)
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestStatusSelectorsAndExitCode(t *testing.T) {
	e := statusEnv(t)
	if code := e.run("status", "-l", "pool=a"); code != 0 {
		t.Errorf("pool=a: exit %d\n%s", code, e.stdout)
	}
	if code := e.run("status", "--instance=db"); code != ExitError {
		t.Errorf("db on all nodes: exit %d", code)
	}
	if code := e.run("status", "-l", "pool=b", "--instance=web"); code != ExitError {
		t.Errorf("web on pool b: exit %d", code)
	}
	if code := e.run("status", "-l", "pool=none"); code != ExitError {
		t.Errorf("no nodes selected must not pass a CI gate: exit %d", code)
	}
}

func TestStatusJSON(t *testing.T) {
	e := statusEnv(t)
	e.run("status", "-o", "json", "--instance=web")
	var rows []NodeStatus
	if err := json.Unmarshal([]byte(e.stdout.String()), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, e.stdout)
	}
	if len(rows) != 2 || rows[1].Node != "n2" || rows[1].Instances[0].State != "failed" || rows[1].Instances[0].Summary.Failed[0].Reason != "NotFound" {
		t.Errorf("%+v", rows)
	}
}

func TestStatusCleanup(t *testing.T) {
	e := statusEnv(t)
	if code := e.run("status", "--cleanup=web"); code != 0 {
		t.Fatalf("exit %d: %s", code, e.logs)
	}
	if !strings.Contains(e.stdout.String(), "2 node(s) cleaned up") {
		t.Errorf("output %q", e.stdout)
	}
	n1 := e.node("n1")
	if _, ok := n1.Labels["image-prefetcher.stackrox.io/web"]; ok {
		t.Error("web label left on n1")
	}
	if n1.Labels["image-prefetcher.stackrox.io/db"] != "succeeded" || n1.Annotations["keep"] != "me" || n1.Labels["pool"] != "a" || n1.Annotations["image-prefetcher.stackrox.io/db"] == "" {
		t.Errorf("cleanup touched other keys: %v %v", n1.Labels, n1.Annotations)
	}
	if n2 := e.node("n2"); len(n2.Annotations) != 0 || len(n2.Labels) != 1 {
		t.Errorf("n2: %v %v", n2.Labels, n2.Annotations)
	}
}

func TestVersion(t *testing.T) {
	e := newEnv(t)
	if code := e.run("version"); code != 0 || strings.TrimSpace(e.stdout.String()) == "" {
		t.Errorf("exit %d output %q", code, e.stdout)
	}
}
