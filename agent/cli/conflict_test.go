package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// claimKey makes this instance's key belong to the instance of the same
// name in namespace ns, with the given label value.
func (e *env) claimKey(ns, value string) string {
	e.t.Helper()
	return e.claimKeyBy(label.NewOwner(ns, testInstance), value)
}

func (e *env) claimKeyBy(o label.Owner, value string) string {
	e.t.Helper()
	s := label.NewSummary(3, 3, nil, time.Second, time.Unix(0, 0))
	s.Owner = &o
	ann := s.Marshal()
	n := e.node(testNode)
	n.Labels[testKey] = value
	n.Annotations[testKey] = ann
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return ann
}

func (e *env) keyUnchanged(value, ann string) {
	e.t.Helper()
	n := e.node(testNode)
	if n.Labels[testKey] != value || n.Annotations[testKey] != ann {
		e.t.Errorf("the other owner's key changed: %q %q", n.Labels[testKey], n.Annotations[testKey])
	}
}

func (e *env) conflictEvents(ns string) []corev1.Event {
	e.t.Helper()
	evs, err := e.kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range evs.Items {
		if ev.Reason == "InstanceConflict" {
			out = append(out, ev)
		}
	}
	return out
}

// TestFetchOwnerConflict: the key belongs to the same-name instance of
// another namespace. fetch pulls, then leaves the key alone, says so
// (an error line naming both owners, a Warning Event on its pod) and
// fails, so that the pod shows it.
func TestFetchOwnerConflict(t *testing.T) {
	e := newEnv(t)
	ann := e.claimKey("team-a", "failed")
	e.getenv["POD_NAME"] = "prefetch-abc"
	e.getenv["POD_NAMESPACE"] = testNamespace
	if code := e.run(e.agentArgs("fetch", "x:1")...); code != ExitOwnerConflict {
		t.Errorf("exit %d, want %d:\n%s", code, ExitOwnerConflict, e.logs)
	}
	e.keyUnchanged("failed", ann)
	e.assertOthersUntouched()
	logs := e.logs.String()
	if !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "owner=team-a/demo") || !strings.Contains(logs, "thisInstance=prefetch/demo") {
		t.Errorf("no error line naming both owners:\n%s", logs)
	}
	evs := e.conflictEvents(testNamespace)
	if len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning || evs[0].InvolvedObject.Name != "prefetch-abc" ||
		!strings.Contains(evs[0].Message, "team-a/demo") || !strings.Contains(evs[0].Message, "prefetch/demo") {
		t.Errorf("events %+v", evs)
	}
	if strings.Contains(logs, "node labeled") {
		t.Errorf("claims to have labeled:\n%s", logs)
	}
}

// TestFetchCopyConflict: the key belongs to another copy of this very
// instance (one rendering applied under two namePrefixes): DaemonSet
// a-prefetch owns it, this pod is b-prefetch's. fetch leaves it alone and
// fails as for another instance, and the Event names both DaemonSets. A
// record of an earlier release, without a DaemonSet, is this copy's: it is
// rewritten with the DaemonSet.
func TestFetchCopyConflict(t *testing.T) {
	for _, tc := range []struct {
		name, owner string
		want        int
	}{
		{"another copy's key", "a-prefetch", ExitOwnerConflict},
		{"an earlier release's key", "", ExitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			o := label.NewOwner(testNamespace, testInstance)
			o.DaemonSet = tc.owner
			ann := e.claimKeyBy(o, "failed")
			e.getenv["POD_NAME"] = "b-prefetch-x7k2q"
			e.getenv["POD_NAMESPACE"] = testNamespace
			if code := e.run(e.agentArgs("fetch", "x:1")...); code != tc.want {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.want, e.logs)
			}
			if tc.want == ExitOwnerConflict {
				e.keyUnchanged("failed", ann)
				evs := e.conflictEvents(testNamespace)
				if len(evs) != 1 || !strings.Contains(evs[0].Message, "DaemonSet a-prefetch, another copy of this instance prefetch/demo (this is DaemonSet b-prefetch)") {
					t.Errorf("events %+v", evs)
				}
				return
			}
			n := e.node(testNode)
			if want := `{"owner":{"namespace":"prefetch","name":"demo","daemonSet":"b-prefetch","id":`; n.Labels[testKey] != "succeeded" || !strings.HasPrefix(n.Annotations[testKey], want) {
				t.Errorf("key %q %s, want succeeded and %s...", n.Labels[testKey], n.Annotations[testKey], want)
			}
		})
	}
}

// TestFetchAdoptsAnUnownedKey: a key written without an owner (an earlier
// release, the reference agent, by hand) is taken over in one write.
func TestFetchAdoptsAnUnownedKey(t *testing.T) {
	e := newEnv(t)
	patch := `{"metadata":{"labels":{"` + testKey + `":"succeeded"},"annotations":{"` + testKey + `":"{\"total\":1,\"present\":1,\"failed\":[]}"}}}`
	if _, err := e.kube.CoreV1().Nodes().Patch(context.Background(), testNode, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The image is already there: a key that says succeeded stays so
	// (fetch marks a key failed while it pulls missing images).
	e.cri.AddImage("docker.io/library/x:1", 1000)
	e.kube.ClearActions()
	if code := e.run(e.agentArgs("fetch", "x:1")...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	v, s, ok := e.state()
	if !ok || v != "succeeded" || s.Owner == nil || *s.Owner != label.NewOwner(testNamespace, testInstance) {
		t.Errorf("label %q owner %+v", v, s.Owner)
	}
	writes := 0
	for _, a := range e.kube.Actions() {
		if a.GetVerb() == "patch" || a.GetVerb() == "update" {
			writes++
		}
	}
	if writes != 1 {
		t.Errorf("%d writes, want one: no removal or intermediate value on the way", writes)
	}
}

// TestWatchOwnerConflict: watch checks and reports at every refresh, sets
// the conflict metric, and on SIGTERM does not remove the other owner's
// key.
func TestWatchOwnerConflict(t *testing.T) {
	e := newEnv(t)
	ann := e.claimKey("team-a", "succeeded")
	e.getenv["POD_NAME"] = "prefetch-abc"
	e.getenv["POD_NAMESPACE"] = testNamespace
	done := e.startWatch("--refresh-interval=10ms", "--metrics-addr=127.0.0.1:0", "x:1")
	addr := e.metricsAddr()
	waitFor(t, "the conflict metric", func() bool {
		m, err := scrape(addr)
		return err == nil && has(m, map[string]float64{"image_prefetcher_owner_conflict": 1})
	})
	// The fake API server does not fill in generateName, so it keeps one
	// Event per pod; the log shows every check.
	waitFor(t, "two checks reporting", func() bool {
		return strings.Count(e.logs.String(), "the node key belongs to another instance") >= 2 && len(e.conflictEvents(testNamespace)) == 1
	})
	if code := e.sigterm(done); code != 0 {
		t.Errorf("exit %d:\n%s", code, e.logs)
	}
	e.keyUnchanged("succeeded", ann)
	e.assertOthersUntouched()
	if !strings.Contains(e.logs.String(), "not removing the node label: it belongs to another instance") {
		t.Errorf("logs:\n%s", e.logs)
	}
}

// TestWatchRemovesItsOwnKey: the owner's watch removes its key on SIGTERM.
func TestWatchRemovesItsOwnKey(t *testing.T) {
	e := newEnv(t)
	done := e.startWatch("--refresh-interval=10ms", "--metrics-addr=127.0.0.1:0", "x:1")
	waitFor(t, "label succeeded", e.labelIs("succeeded"))
	addr := e.metricsAddr()
	if m, err := scrape(addr); err != nil || !has(m, map[string]float64{"image_prefetcher_owner_conflict": 0}) {
		t.Errorf("conflict metric: %v %v", m["image_prefetcher_owner_conflict"], err)
	}
	if code := e.sigterm(done); code != 0 {
		t.Errorf("exit %d:\n%s", code, e.logs)
	}
	if _, has := e.node(testNode).Labels[testKey]; has {
		t.Error("own key left behind")
	}
}
