package cli

import (
	"context"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// startWatch runs watch in the background and returns its exit code channel.
func (e *env) startWatch(extra ...string) chan int {
	done := make(chan int, 1)
	args := e.agentArgs("watch", extra...)
	go func() { done <- e.run(args...) }()
	select {
	case <-e.ready:
	case code := <-done:
		e.t.Fatalf("watch exited early with %d:\n%s", code, e.logs)
	}
	return done
}

func (e *env) sigterm(done chan int) int {
	e.t.Helper()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		e.t.Fatal(err)
	}
	return <-done
}

// summaryIs reports whether the node's label and annotation satisfy ok.
func (e *env) summaryIs(ok func(value string, s label.Summary) bool) func() bool {
	return func() bool {
		v, s, found := e.state()
		return found && ok(v, s)
	}
}

func (e *env) labelIs(want string) func() bool {
	return func() bool {
		n, err := e.kube.CoreV1().Nodes().Get(context.Background(), testNode, metav1.GetOptions{})
		return err == nil && n.Labels[testKey] == want && n.Annotations[testKey] != ""
	}
}

func TestWatchRepullsRemovedImagesAndKeepsLabelTruthful(t *testing.T) {
	e := newEnv(t)
	ref := "docker.io/library/app:1"
	done := e.startWatch("--refresh-interval=10ms", "app:1", "quay.io/x/other:2")
	waitFor(t, "label succeeded", e.labelIs("succeeded"))

	// Image garbage collection removes an image: it is pulled again.
	pulls := len(e.cri.Pulls(ref))
	e.cri.DeleteImage(ref)
	waitFor(t, "re-pull", func() bool { return len(e.cri.Pulls(ref)) > pulls && e.cri.HasImage(ref) })
	// The label may say Removed for a moment before the repair's check
	// rewrites it.
	waitFor(t, "label succeeded with both images present after the re-pull", e.summaryIs(func(v string, s label.Summary) bool {
		return v == "succeeded" && s.Present == 2
	}))

	// Someone removes the label: it comes back.
	patch := []byte(`{"metadata":{"labels":{"` + testKey + `":null}}}`)
	if _, err := e.kube.CoreV1().Nodes().Patch(context.Background(), testNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "label re-applied", e.labelIs("succeeded"))

	// Removed and no longer pullable: failed, with the reason. The other
	// image: app:1 removed a second time after its re-pull would be held
	// back as one the node's GC keeps removing (RemovedByGC).
	other := "quay.io/x/other:2"
	e.cri.SetBehavior(other, func(context.Context, int, *runtimeapi.PullImageRequest) error { return fakecri.NotFound(other) })
	e.cri.DeleteImage(other)
	// Removed first, then NotFound once the repair has tried to pull it.
	waitFor(t, "label failed with the image NotFound", e.summaryIs(func(v string, s label.Summary) bool {
		return v == "failed" && len(s.Failed) == 1 && s.Failed[0].Reason == pull.ReasonNotFound && s.Present == 1
	}))
	// Pullable again: succeeded again.
	e.cri.SetBehavior(other, nil)
	waitFor(t, "label succeeded again", e.labelIs("succeeded"))

	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	n := e.node(testNode)
	if _, ok := n.Labels[testKey]; ok {
		t.Error("label left behind after SIGTERM")
	}
	if _, ok := n.Annotations[testKey]; ok {
		t.Error("annotation left behind after SIGTERM")
	}
	e.assertOthersUntouched()
}

func TestWatchDoesNotRewriteAnUnchangedLabel(t *testing.T) {
	e := newEnv(t)
	done := e.startWatch("--refresh-interval=5ms", "app:1")
	waitFor(t, "label succeeded", e.labelIs("succeeded"))
	// The label may have said failed (Missing) first: the keeper flips it
	// when the first pull outlasts the 5 ms interval. Count from the
	// write of succeeded, over several more checks.
	patches := func() (n int) {
		for _, a := range e.kube.Actions() {
			if a.GetVerb() == "patch" {
				n++
			}
		}
		return n
	}
	before := patches()
	statuses := e.cri.StatusCalls()
	waitFor(t, "more checks", func() bool { return e.cri.StatusCalls() > statuses+5 })
	if n := patches() - before; n != 0 {
		t.Errorf("%d patches after the label said succeeded, want 0: an unchanged state must not be rewritten", n)
	}
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestWatchWithoutRefreshRemovesLabelOnSIGTERM(t *testing.T) {
	e := newEnv(t)
	// fetch labels first, as the init container does.
	if code := e.run(e.agentArgs("fetch", "app:1")...); code != 0 {
		t.Fatalf("fetch exit %d", code)
	}
	done := e.startWatch("--refresh-interval=0", "app:1")
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	if _, ok := e.node(testNode).Labels[testKey]; ok {
		t.Error("label left behind")
	}
	e.assertOthersUntouched()
}

func TestWatchKeepsLabelWhenAsked(t *testing.T) {
	e := newEnv(t)
	done := e.startWatch("--refresh-interval=5ms", "--remove-label-on-exit=false", "app:1")
	waitFor(t, "label succeeded", e.labelIs("succeeded"))
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if v, _, _ := e.state(); v != "succeeded" {
		t.Errorf("label %q", v)
	}
}

func TestSleepWaitsForSIGTERM(t *testing.T) {
	e := newEnv(t)
	done := make(chan int, 1)
	go func() { done <- e.run("sleep") }()
	<-e.ready
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestWatchExitsOnSIGTERMWhileTheAPIServerIsDown(t *testing.T) {
	e := newEnv(t)
	done := e.startWatch("--refresh-interval=5ms", "--remove-label-timeout=50ms", "app:1")
	waitFor(t, "label succeeded", e.labelIs("succeeded"))
	e.kube.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	// The label drifts, so the next checks keep trying to rewrite it.
	e.cri.DeleteImage("docker.io/library/app:1")
	e.cri.SetBehavior("docker.io/library/app:1", func(context.Context, int, *runtimeapi.PullImageRequest) error {
		return fakecri.NotFound("docker.io/library/app:1")
	})
	waitFor(t, "a failing rewrite", func() bool { return strings.Contains(e.logs.String(), "patching node failed") })
	if code := e.sigterm(done); code != ExitError {
		t.Errorf("exit %d, want %d: the label could not be removed", code, ExitError)
	}
	if !strings.Contains(e.logs.String(), "removing the node label failed") {
		t.Errorf("logs:\n%s", e.logs)
	}
}

// TestWatchRelabelsARecreatedNode: a Node deleted and created again, as
// when a node re-registers, comes back with the kubelet's labels only; the
// next check finds the label gone and writes it again.
func TestWatchRelabelsARecreatedNode(t *testing.T) {
	e := newEnv(t)
	done := e.startWatch("--refresh-interval=5ms", "app:1")
	waitFor(t, "label succeeded", e.labelIs("succeeded"))

	nodes := e.kube.CoreV1().Nodes()
	if err := nodes.Delete(context.Background(), testNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Let a check run against the missing node.
	statuses := e.cri.StatusCalls()
	waitFor(t, "a check while the node is gone", func() bool { return e.cri.StatusCalls() > statuses+1 })
	fresh := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{"kubernetes.io/hostname": testNode}}}
	if _, err := nodes.Create(context.Background(), fresh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "label back on the re-created node", e.labelIs("succeeded"))
	if v, s, ok := e.state(); !ok || v != "succeeded" || s.Total != 1 || s.Present != 1 {
		t.Errorf("label %q summary %+v", v, s)
	}
	if n := e.node(testNode); n.Labels["kubernetes.io/hostname"] != testNode || len(n.Labels) != 2 {
		t.Errorf("labels %v: only this instance's key may be added", n.Labels)
	}
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
}
