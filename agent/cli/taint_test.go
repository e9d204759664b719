package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/taint"
)

const testTaint = "startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"

var otherTaint = corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}

// taintNode gives the test node the startup taint and one other.
func (e *env) taintNode() {
	e.t.Helper()
	n := e.node(testNode)
	n.Spec.Taints = []corev1.Taint{{Key: testTaint, Effect: corev1.TaintEffectNoSchedule}, otherTaint}
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) events(reason string) []corev1.Event {
	e.t.Helper()
	return e.eventsIn("prefetch", reason)
}

func (e *env) eventsIn(ns, reason string) []corev1.Event {
	e.t.Helper()
	list, err := e.kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

func TestFetchRemovesStartupTaintOnceImagesPresent(t *testing.T) {
	e := newEnv(t)
	e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = "agent-x", "prefetch"
	e.taintNode()
	list := writeList(t, "debian:12\n")
	if code := e.run(e.agentArgs("fetch", "--image-list-file="+list, "--startup-taint="+testTaint)...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	if got := e.node(testNode).Spec.Taints; !reflect.DeepEqual(got, []corev1.Taint{otherTaint}) {
		t.Errorf("taints %v, want only the other one", got)
	}
	v, s, ok := e.state()
	if !ok || v != "succeeded" || s.StartupTaint != testTaint {
		t.Errorf("label %q, summary %+v: want succeeded, naming the startup taint", v, s)
	}
	if evs := e.events(taint.ReasonRemoved); len(evs) != 1 || evs[0].Type != corev1.EventTypeNormal {
		t.Errorf("events %v, want one Normal %s", evs, taint.ReasonRemoved)
	}
	if len(e.node("node-b").Spec.Taints) != 0 {
		t.Error("the other node changed")
	}
	e.assertOthersUntouched()

	// status shows the taint column, keyed by what the summary recorded,
	// beside the pin column (the fake CRI is no runtime that can pin) and
	// the disk column (no kubelet, no mount: the ceiling holds nothing).
	e.stdout = &syncBuffer{}
	if code := e.run("status", "--instance="+testInstance, "-l", "kubernetes.io/hostname="+testNode); code != 0 {
		t.Errorf("status exit %d:\n%s", code, e.stdout)
	}
	want := "NODE    INSTANCE  STATE      OWNER          STARTUP-TAINT  PRESENT  PINNED               IMAGE-FS             FAILURES\nnode-a  demo      succeeded  prefetch/demo  absent         1/1      pinning unsupported  unknown: no ceiling  -\n"
	if got := e.stdout.String(); got != want {
		t.Errorf("status:\n%s\nwant:\n%s", got, want)
	}
}

func TestFetchKeepsStartupTaintWithImagesMissing(t *testing.T) {
	e := newEnv(t)
	e.taintNode()
	e.cri.SetBehavior("docker.io/library/missing:1", func(context.Context, int, *runtimeapi.PullImageRequest) error {
		return fakecri.NotFound("docker.io/library/missing:1")
	})
	list := writeList(t, "missing:1\n")
	if code := e.run(e.agentArgs("fetch", "--image-list-file="+list, "--startup-taint="+testTaint, "--startup-taint-max-wait=0")...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	if got := e.node(testNode).Spec.Taints; len(got) != 2 {
		t.Errorf("taints %v, want both kept", got)
	}
	if v, _, _ := e.state(); v != "failed" {
		t.Errorf("label %q", v)
	}
	e.stdout = &syncBuffer{}
	e.run("status", "--instance="+testInstance, "-l", "kubernetes.io/hostname="+testNode, "-o", "json")
	if !strings.Contains(e.stdout.String(), `"startupTaint": {`+"\n"+`          "key": "`+testTaint+`",`+"\n"+`          "present": true`) {
		t.Errorf("status -o json does not say the taint is present:\n%s", e.stdout)
	}
}

// maxWait counts from the pod's first start, recorded in the pod's
// emptyDir: a restarted container whose pod started long ago removes the
// taint at once, with the Warning Event, while its pull is still running.
func TestFetchRemovesStartupTaintAtMaxWaitWhilePulling(t *testing.T) {
	e := newEnv(t)
	e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = "agent-x", "prefetch"
	e.taintNode()
	startFile := filepath.Join(t.TempDir(), "pod-started-at")
	if err := os.WriteFile(startFile, []byte(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The pull finishes only once the taint is gone: the removal cannot
	// have waited for the label.
	e.cri.SetBehavior("docker.io/library/slow:1", func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
		for range 100 {
			n, err := e.kube.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
			if err == nil && !taint.Has(n, testTaint) {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return errors.New("the startup taint was not removed while pulling")
	})
	list := writeList(t, "slow:1\n")
	if code := e.run(e.agentArgs("fetch", "--image-list-file="+list, "--startup-taint="+testTaint, "--startup-taint-max-wait=30m", "--pod-start-file="+startFile)...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	if v, _, _ := e.state(); v != "succeeded" {
		t.Errorf("label %q, want succeeded: the pull waited for the removal\n%s", v, e.logs)
	}
	evs := e.events(taint.ReasonTimeout)
	if len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning || !strings.Contains(evs[0].Message, "maxWait 30m0s") {
		t.Errorf("events %v, want one Warning %s", evs, taint.ReasonTimeout)
	}
	if len(e.events(taint.ReasonRemoved)) != 0 {
		t.Error("a second removal Event")
	}
}

func TestStartupTaintNeedsLabeling(t *testing.T) {
	e := newEnv(t)
	if code := e.run(e.agentArgs("fetch", "--label-node=false", "--startup-taint="+testTaint)...); code != ExitUsage {
		t.Errorf("exit %d, want %d\n%s", code, ExitUsage, e.logs)
	}
}

// Before any agent has written a summary (the first nodes still pulling),
// --startup-taint names the key.
func TestStatusStartupTaintFlag(t *testing.T) {
	e := statusEnv(t)
	n, err := e.kube.CoreV1().Nodes().Get(context.Background(), "n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: testTaint, Effect: corev1.TaintEffectNoSchedule}}
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run("status", "--instance=web", "--startup-taint="+testTaint)
	want := `NODE  INSTANCE  STATE      OWNER  STARTUP-TAINT  PRESENT  FAILURES
n1    web       succeeded  -      absent         2/2      -
n2    web       failed     -      present        1/2      typo:1 (NotFound)
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// An agent that cannot reach its runtime still lets the taint go once
// maxWait has passed, at the restart the kubelet gives it.
func TestFetchWithoutRuntimeFailsOpenAtMaxWait(t *testing.T) {
	e := newEnv(t)
	e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = "agent-x", "prefetch"
	e.taintNode()
	startFile := filepath.Join(t.TempDir(), "pod-started-at")
	args := e.agentArgs("fetch", "--cri-socket=/does/not/exist.sock", "--startup-taint="+testTaint, "--startup-taint-max-wait=1h", "--pod-start-file="+startFile, "x:1")
	if code := e.run(args...); code != ExitError {
		t.Fatalf("exit %d", code)
	}
	if !taint.Has(e.node(testNode), testTaint) {
		t.Fatal("the taint went before maxWait")
	}
	// The pod started more than maxWait ago.
	if err := os.WriteFile(startFile, []byte(time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339Nano)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := e.run(args...); code != ExitError {
		t.Fatalf("exit %d", code)
	}
	if got := e.node(testNode).Spec.Taints; !reflect.DeepEqual(got, []corev1.Taint{otherTaint}) {
		t.Errorf("taints %v, want only the other one", got)
	}
	if evs := e.events(taint.ReasonTimeout); len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning {
		t.Errorf("events %v, want one Warning %s", evs, taint.ReasonTimeout)
	}
}
