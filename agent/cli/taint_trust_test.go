package cli

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/taint"
)

// otherKey is the key of a second instance, "other", in the test's
// namespace; helpers_test.go puts it on the node (failed, "{}").
const otherKey = "image-prefetcher.stackrox.io/other"

// holdTaint makes instance other a holder of the startup taint testTaint on
// the node: its label is value, its annotation names the taint and the
// deadline (none for a zero time), as its agent writes them.
func (e *env) holdTaint(value string, deadline time.Time) {
	e.t.Helper()
	o := label.NewOwner(testNamespace, "other")
	dl := ""
	if !deadline.IsZero() {
		dl = deadline.UTC().Format(time.RFC3339)
	}
	ann := fmt.Sprintf(`{"owner":{"namespace":%q,"name":"other","id":%q},"total":1,"present":0,"failed":[{"image":"x:1","reason":"Missing","message":"being pulled"}],"durationSeconds":0,"completedAt":"","startupTaint":%q,"startupTaintDeadline":%q}`,
		o.Namespace, o.ID, testTaint, dl)
	if value == "succeeded" {
		ann = fmt.Sprintf(`{"owner":{"namespace":%q,"name":"other","id":%q},"total":1,"present":1,"failed":[],"durationSeconds":1,"completedAt":"2026-11-24T12:00:00Z","startupTaint":%q,"startupTaintDeadline":%q}`,
			o.Namespace, o.ID, testTaint, dl)
	}
	n := e.node(testNode)
	n.Labels[otherKey], n.Annotations[otherKey] = value, ann
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) missing(ref string) {
	e.cri.SetBehavior(ref, func(context.Context, int, *runtimeapi.PullImageRequest) error { return fakecri.NotFound(ref) })
}

func (e *env) tainted() bool {
	e.t.Helper()
	return taint.Has(e.node(testNode), testTaint)
}

// The startup taint goes only when this pod's own run found every image
// of its own list present, or at maxWait: a succeeded that someone else
// wrote (issue 26, finding 2) never counts.
func TestStartupTaintTrustsOnlyThisRun(t *testing.T) {
	t.Run("another owner's succeeded on the key (same name, other namespace)", func(t *testing.T) {
		e := newEnv(t)
		e.claimKey("team-b", "succeeded")
		e.taintNode()
		e.missing("docker.io/library/x:1")
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "--startup-taint-max-wait=0", "x:1")...); code != ExitOwnerConflict {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if !e.tainted() {
			t.Error("the taint went on another instance's succeeded while this one's image is missing")
		}
	})
	t.Run("a succeeded kept from the previous pod", func(t *testing.T) {
		e := newEnv(t)
		e.claimKey(testNamespace, "succeeded")
		e.getenv["POD_UID"] = "uid-of-the-new-pod"
		e.taintNode()
		e.missing("docker.io/library/x:1")
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "--startup-taint-max-wait=0", "x:1")...); code != 0 {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if !e.tainted() {
			t.Error("the taint went on a succeeded this pod did not write")
		}
		if v, _, _ := e.state(); v != "failed" {
			t.Errorf("label %q", v)
		}
	})
	t.Run("the owner's failed with maxWait 0 does not hold another instance's taint", func(t *testing.T) {
		e := newEnv(t)
		e.claimKey("team-b", "failed")
		e.taintNode()
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "--startup-taint-max-wait=0", "x:1")...); code != ExitOwnerConflict {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if got := e.node(testNode).Spec.Taints; !reflect.DeepEqual(got, []corev1.Taint{otherTaint}) {
			t.Errorf("taints %v: this instance's images are all present, its taint must go", got)
		}
	})
}

// Two instances that share one taint key each wait for their own set: the
// node is untainted once every registered holder is done or past its
// deadline.
func TestStartupTaintSharedKey(t *testing.T) {
	t.Run("the other holder is still pulling", func(t *testing.T) {
		e := newEnv(t)
		e.taintNode()
		e.holdTaint("failed", time.Now().Add(time.Hour))
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "x:1")...); code != 0 {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if !e.tainted() {
			t.Fatal("the shared taint went while the other holder still pulls")
		}
		// The other one is done: this instance's next look removes it.
		e.holdTaint("succeeded", time.Now().Add(time.Hour))
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "x:1")...); code != 0 {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if got := e.node(testNode).Spec.Taints; !reflect.DeepEqual(got, []corev1.Taint{otherTaint}) {
			t.Errorf("taints %v, want only the other one", got)
		}
	})
	t.Run("the other holder is past its deadline", func(t *testing.T) {
		e := newEnv(t)
		e.taintNode()
		e.holdTaint("failed", time.Now().Add(-time.Minute))
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "x:1")...); code != 0 {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if e.tainted() {
			t.Error("the taint stayed although the other holder's deadline passed")
		}
	})
	t.Run("the other holder has no deadline and failed", func(t *testing.T) {
		e := newEnv(t)
		e.taintNode()
		e.holdTaint("failed", time.Time{})
		if code := e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "x:1")...); code != 0 {
			t.Fatalf("exit %d:\n%s", code, e.logs)
		}
		if !e.tainted() {
			t.Error("the taint went although the other holder (maxWait 0) still waits for its images")
		}
	})
}

// A holder registered on the node must not outlive its instance: fetch
// stopped mid-pull because its DaemonSet was deleted removes its key, so
// that another holder of the taint stops waiting for it.
func TestFetchTerminatedWithdrawsItsRegistration(t *testing.T) {
	for _, deleted := range []bool{true, false} {
		t.Run(map[bool]string{true: "DaemonSet deleted", false: "DaemonSet rolling"}[deleted], func(t *testing.T) {
			e := newEnv(t)
			ds := daemonSet(testNamespace, "image-prefetcher-demo", "x:1")
			if !deleted {
				if _, err := e.kube.AppsV1().DaemonSets(testNamespace).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			e.ownPod(testNamespace, "image-prefetcher-demo-x7k2p", ds)
			e.taintNode()
			pulling := make(chan struct{})
			e.cri.SetBehavior("docker.io/library/x:1", func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
				close(pulling)
				<-ctx.Done()
				return ctx.Err()
			})
			done := make(chan int, 1)
			go func() { done <- e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "x:1")...) }()
			<-pulling
			if v, s, ok := e.state(); !ok || v != "failed" || s.StartupTaint != testTaint {
				t.Fatalf("not registered before the pull: label %q summary %+v", v, s)
			}
			if code := e.sigterm(done); code != ExitError {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			_, _, registered := e.state()
			if registered == deleted {
				t.Errorf("key on the node: %v, want %v\n%s", registered, !deleted, e.logs)
			}
			if !e.tainted() {
				t.Error("the taint went")
			}
		})
	}
}

// The same while fetch still waits for its runtime: the registration was
// written first thing, and the DaemonSet is gone.
func TestFetchTerminatedWhileStartingWithdrawsItsRegistration(t *testing.T) {
	e := newEnv(t)
	e.ownPod(testNamespace, "image-prefetcher-demo-x7k2p", daemonSet(testNamespace, "image-prefetcher-demo", "x:1"))
	e.taintNode()
	// A runtime that accepts connections and never answers.
	sock := filepath.Join(t.TempDir(), "silent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	done := make(chan int, 1)
	go func() {
		done <- e.run(e.agentArgs("fetch", "--startup-taint="+testTaint, "--cri-socket="+sock, "--cri-connect-timeout=10m", "x:1")...)
	}()
	waitFor(t, "the registration", func() bool {
		v, s, ok := e.state()
		return ok && v == "failed" && s.StartupTaint == testTaint
	})
	if code := e.sigterm(done); code != ExitError {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	if _, _, registered := e.state(); registered {
		t.Errorf("the registration outlived the deleted DaemonSet\n%s", e.logs)
	}
}
