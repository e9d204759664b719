package cli

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
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
	want := `NODE  INSTANCE  STATE      OWNER  PRESENT  FAILURES
n1    db        succeeded  -      2/2      -
n1    web       succeeded  -      2/2      -
n2    db        missing    -      -        -
n2    web       failed     -      1/2      typo:1 (NotFound)
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
	if code := e.run("status", "--cleanup=web", "--namespace=prefetch", "--include-unowned"); code != 0 {
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

// ownedBy is an annotation of instance name owned by namespace ns.
func ownedBy(ns, name, value string) string {
	o := label.NewOwner(ns, name)
	s := label.NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
	if value == "failed" {
		s = label.NewSummary(1, 0, []label.Failure{{Image: "x:1", Reason: "NotFound"}}, time.Second, time.Unix(0, 0))
	}
	s.Owner = &o
	return s.Marshal()
}

// ownersEnv: instance web is owned by team-a on n1 and n2 and by team-b
// on n3; n4 carries a key without an owner; db is team-a's alone.
func ownersEnv(t *testing.T) *env {
	e := newEnv(t)
	const web, db = "image-prefetcher.stackrox.io/web", "image-prefetcher.stackrox.io/db"
	mk := func(name string, labels, ann map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ann}}
	}
	e.kube = fake.NewClientset(
		mk("n1", map[string]string{web: "succeeded", db: "succeeded"}, map[string]string{web: ownedBy("team-a", "web", "succeeded"), db: ownedBy("team-a", "db", "succeeded")}),
		mk("n2", map[string]string{web: "failed"}, map[string]string{web: ownedBy("team-a", "web", "failed")}),
		mk("n3", map[string]string{web: "succeeded"}, map[string]string{web: ownedBy("team-b", "web", "succeeded")}),
		mk("n4", map[string]string{web: "succeeded"}, map[string]string{web: `{"total":1,"present":1,"failed":[]}`}),
	)
	return e
}

func TestStatusShowsOwnersAndConflicts(t *testing.T) {
	e := ownersEnv(t)
	if code := e.run("status", "--instance=web"); code != ExitError {
		t.Errorf("exit %d, want 1", code)
	}
	want := `NODE  INSTANCE  STATE      OWNER                  PRESENT  FAILURES
n1    web       succeeded  team-a/web (conflict)  1/1      -
n2    web       failed     team-a/web (conflict)  0/1      x:1 (NotFound)
n3    web       succeeded  team-b/web (conflict)  1/1      -
n4    web       succeeded  -                      1/1      -
conflict on node n1, instance web: owned by team-a/web here and by team-b/web elsewhere: two instances share the name "web"
conflict on node n2, instance web: owned by team-a/web here and by team-b/web elsewhere: two instances share the name "web"
conflict on node n3, instance web: owned by team-b/web here and by team-a/web elsewhere: two instances share the name "web"
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}

	// With the namespace, only the other owner's keys are conflicts.
	e.stdout = &syncBuffer{}
	if code := e.run("status", "--instance=web", "--namespace=team-b", "-o", "json"); code != ExitError {
		t.Errorf("exit %d, want 1", code)
	}
	var rows []NodeStatus
	if err := json.Unmarshal([]byte(e.stdout.String()), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, e.stdout)
	}
	for _, r := range rows {
		i := r.Instances[0]
		wantConflict := r.Node == "n1" || r.Node == "n2"
		if (i.Conflict != "") != wantConflict {
			t.Errorf("%s: conflict %q", r.Node, i.Conflict)
		}
		if r.Node == "n3" && (i.Owner == nil || *i.Owner != label.NewOwner("team-b", "web")) {
			t.Errorf("n3 owner %+v", i.Owner)
		}
	}
	e.stdout = &syncBuffer{}
	// The instance's own keys, all succeeded, pass.
	if code := e.run("status", "--instance=db", "--namespace=team-a", "-l", "image-prefetcher.stackrox.io/db"); code != 0 {
		t.Errorf("exit %d:\n%s", code, e.stdout)
	}
}

// TestStatusShowsCopies: instance team-a/web owns n1 as copy a (DaemonSet
// a-image-prefetcher-web), n2 as copy b, and n3 as an earlier release wrote
// it, without a DaemonSet. Copies a and b are one rendering applied twice:
// their keys are conflicts; the earlier release's key is not.
func TestStatusShowsCopies(t *testing.T) {
	e := newEnv(t)
	const web = "image-prefetcher.stackrox.io/web"
	copyOf := func(ds string) string {
		o := label.NewOwner("team-a", "web")
		o.DaemonSet = ds
		s := label.NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
		s.Owner = &o
		return s.Marshal()
	}
	var nodes []runtime.Object
	for name, ds := range map[string]string{"n1": "a-image-prefetcher-web", "n2": "b-image-prefetcher-web", "n3": ""} {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{web: "succeeded"}, Annotations: map[string]string{web: copyOf(ds)}}})
	}
	e.kube = fake.NewClientset(nodes...)
	if code := e.run("status", "--instance=web", "--namespace=team-a"); code != ExitError {
		t.Errorf("exit %d, want 1", code)
	}
	want := `NODE  INSTANCE  STATE      OWNER                  PRESENT  FAILURES
n1    web       succeeded  team-a/web (conflict)  1/1      -
n2    web       succeeded  team-a/web (conflict)  1/1      -
n3    web       succeeded  team-a/web             1/1      -
conflict on node n1, instance web: owned by DaemonSet a-image-prefetcher-web here and by DaemonSet b-image-prefetcher-web elsewhere: one rendering of team-a/web applied twice under different names
conflict on node n2, instance web: owned by DaemonSet b-image-prefetcher-web here and by DaemonSet a-image-prefetcher-web elsewhere: one rendering of team-a/web applied twice under different names
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestStatusCleanupRemovesOnlyOwnKeys(t *testing.T) {
	const web = "image-prefetcher.stackrox.io/web"
	has := func(e *env, node string) bool {
		n := e.node(node)
		_, l := n.Labels[web]
		_, a := n.Annotations[web]
		return l || a
	}
	cases := []struct {
		name string
		args []string
		kept []string
	}{
		{"team-a's", []string{"--namespace=team-a"}, []string{"n3", "n4"}},
		{"team-b's", []string{"--namespace=team-b"}, []string{"n1", "n2", "n4"}},
		{"team-a's and unowned", []string{"--namespace=team-a", "--include-unowned"}, []string{"n3"}},
		{"another namespace's", []string{"--namespace=team-c"}, []string{"n1", "n2", "n3", "n4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := ownersEnv(t)
			if code := e.run(append([]string{"status", "--cleanup=web"}, tc.args...)...); code != 0 {
				t.Fatalf("exit %d: %s", code, e.logs)
			}
			for _, n := range []string{"n1", "n2", "n3", "n4"} {
				if want := slices.Contains(tc.kept, n); has(e, n) != want {
					t.Errorf("%s: key kept %v, want %v\n%s", n, has(e, n), want, e.stdout)
				}
			}
			if e.node("n1").Labels["image-prefetcher.stackrox.io/db"] != "succeeded" {
				t.Error("cleanup touched db")
			}
		})
	}
	e := ownersEnv(t)
	if code := e.run("status", "--cleanup=web"); code != ExitUsage || !strings.Contains(e.logs.String(), "--cleanup needs --namespace") {
		t.Errorf("exit %d: %s", code, e.logs)
	}
}

// TestStatusCleanupWithoutNamespaceIsAUsageError: --cleanup without
// --namespace exits 2 before the client is even built, whatever the
// cluster would answer: a usage error is not a cluster error (exit 1).
func TestStatusCleanupWithoutNamespaceIsAUsageError(t *testing.T) {
	cases := []struct {
		name string
		kube func(e *env) (kube.Interface, error)
	}{
		{"no cluster to reach", func(*env) (kube.Interface, error) {
			return nil, errors.New("not in a pod and no usable kubeconfig")
		}},
		{"nodes cannot be listed", func(e *env) (kube.Interface, error) {
			e.kube.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, errors.New("connection refused")
			})
			return clientset.Wrap(e.kube), nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := ownersEnv(t)
			deps := e.deps()
			calls := 0
			deps.Kube = func(string) (kube.Interface, error) {
				calls++
				return tc.kube(e)
			}
			code := Execute(context.Background(), []string{"status", "--cleanup=web"}, deps)
			if code != ExitUsage || !strings.Contains(e.logs.String(), "--cleanup needs --namespace") {
				t.Errorf("exit %d, want %d: %s", code, ExitUsage, e.logs)
			}
			if calls != 0 {
				t.Errorf("built a Kubernetes client %d times before rejecting the flags", calls)
			}
		})
	}
}

// An image the node's image GC keeps removing gets a line under the table
// saying why it is not downloaded again and what would keep it.
func TestStatusSaysWhyGCRemovedImagesStayAway(t *testing.T) {
	e := newEnv(t)
	ann := `{"total":1,"present":0,"failed":[{"image":"app:1","reason":"RemovedByGC","message":"the node's image GC keeps removing it"}],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z"}`
	e.kube = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Labels: map[string]string{"image-prefetcher.stackrox.io/web": "failed"}, Annotations: map[string]string{"image-prefetcher.stackrox.io/web": ann}}})
	e.run("status")
	want := "node n1, instance web: the node's image GC keeps removing app:1; not downloaded again for now"
	if got := e.stdout.String(); !strings.Contains(got, want) || !strings.Contains(got, "app:1 (RemovedByGC)") {
		t.Errorf("got:\n%s\nwant a line with %q", got, want)
	}
}
