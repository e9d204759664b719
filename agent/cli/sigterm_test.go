package cli

import (
	"context"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// fetch handles SIGTERM (the DaemonSet controller kills not-ready pods
// first during an update): the pull in flight is cancelled, and the slot
// is given back at once instead of holding up every other node for a
// lease duration. A seed cut short has not finished: it does not record
// that seeding is done (issue 26 item 9), so the next node to take a seed
// slot pulls as a seed. No label is written for a run that did not
// finish.
func TestFetchSIGTERMReleasesTheSlot(t *testing.T) {
	const ns, pod = "prefetch", "prefetch-abc"
	e := newEnv(t)
	enforceLeaseVersions(e.kube)
	e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = pod, ns
	ref := "quay.io/org/big:1"
	arrived := make(chan struct{}, 1)
	e.cri.SetBehavior(ref, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
		arrived <- struct{}{}
		return fakecri.Stall(ctx)
	})
	done := make(chan int, 1)
	go func() {
		done <- e.run(e.agentArgs("fetch", "--max-concurrent-nodes=2", "--seed-nodes=1", "--initial-pull-attempt-timeout=10m", ref)...)
	}()
	<-arrived
	l, err := e.kube.CoordinationV1().Leases(ns).Get(context.Background(), "demo-slot-0", metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") == "" {
		t.Fatalf("slot 0 not held during the pull: %v %v", l, err)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != ExitError {
		t.Errorf("exit %d, want %d (did not finish)", code, ExitError)
	}
	l, err = e.kube.CoordinationV1().Leases(ns).Get(context.Background(), "demo-slot-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		t.Errorf("slot 0 still held by %q after SIGTERM", h)
	}
	if v, ok := l.Annotations[slots.SeededAnnotation]; ok {
		t.Errorf("a seed terminated before its pull ended recorded %s=%q", slots.SeededAnnotation, v)
	}
	if _, _, ok := e.state(); ok {
		t.Error("a run cut short by SIGTERM wrote the label")
	}
	e.assertOthersUntouched()
}
