package cli

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// busyGate keeps every caller waiting until open is closed, as herd control
// does while every slot is taken (a rollout with a small K: hours).
type busyGate struct{ open chan struct{} }

func (g busyGate) Hold(ctx context.Context) (pull.Slot, error) {
	select {
	case <-g.open:
		return freeSlot{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// freeSlot is a slot that cannot be lost.
type freeSlot struct{}

func (freeSlot) Release()              {}
func (freeSlot) Lost() <-chan struct{} { return nil }

// A garbage-collected image makes watch wait for a pull slot. Meanwhile the
// label must say the image is missing, and a deleted label or a re-created
// Node must still be repaired; once the image is back, succeeded again.
func TestWatchStaysTruthfulWhileWaitingForASlot(t *testing.T) {
	e := newEnv(t)
	gate := busyGate{open: make(chan struct{})}
	deps := e.deps()
	deps.NewGate = func(context.Context, GateConfig) (pull.Gate, error) { return gate, nil }
	ref := "docker.io/library/app:1"
	e.cri.AddImage(ref, 1)
	e.cri.AddImage("quay.io/x/other:2", 1)
	done := make(chan int, 1)
	go func() {
		done <- Execute(context.Background(), e.agentArgs("watch", "--refresh-interval=20ms", "app:1", "quay.io/x/other:2"), deps)
	}()
	<-e.ready
	waitFor(t, "label succeeded", e.labelIs("succeeded"))

	e.cri.DeleteImage(ref)
	waitFor(t, "label failed while waiting for a slot", e.labelIs("failed"))
	if _, s, _ := e.state(); s.Present != 1 || len(s.Failed) != 1 || s.Failed[0].Reason != pull.ReasonMissing || s.Failed[0].Image != "app:1" {
		t.Errorf("summary %+v, want app:1 Missing", s)
	}

	// Still waiting: a deleted label comes back.
	patch := []byte(`{"metadata":{"labels":{"` + testKey + `":null},"annotations":{"` + testKey + `":null}}}`)
	if _, err := e.kube.CoreV1().Nodes().Patch(context.Background(), testNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "label repaired while waiting", e.labelIs("failed"))

	// Still waiting: a re-created Node is labeled.
	nodes := e.kube.CoreV1().Nodes()
	if err := nodes.Delete(context.Background(), testNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{"kubernetes.io/hostname": testNode}}}
	if _, err := nodes.Create(context.Background(), fresh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "label on the re-created node while waiting", e.labelIs("failed"))
	if e.cri.HasImage(ref) {
		t.Fatal("the image was pulled without a slot")
	}

	// A slot frees up: the image is pulled, and the label says so.
	close(gate.open)
	waitFor(t, "label succeeded after the re-pull", e.labelIs("succeeded"))
	if !e.cri.HasImage(ref) {
		t.Error("image not pulled again")
	}
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
}
