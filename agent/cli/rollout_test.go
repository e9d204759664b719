package cli

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// On SIGTERM, watch keeps its key while the instance still covers the node
// (a rollout replaces the pod; the images stay) and removes it when the
// DaemonSet is gone, being deleted, or no longer selects the node. When
// that cannot be told, the key is removed, as before.
func TestWatchKeepsTheLabelAcrossARollout(t *testing.T) {
	const ns, pod, dsName = "prefetch", "image-prefetcher-demo-x7k2p", "image-prefetcher-demo"
	now := metav1.Now()
	tests := []struct {
		name      string
		ds        *appsv1.DaemonSet // nil: none
		pod       string
		wantLabel bool
	}{
		{"rollout: the DaemonSet still selects the node", &appsv1.DaemonSet{}, pod, true},
		{"DaemonSet deleted", nil, pod, false},
		{"DaemonSet being deleted", &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now, Finalizers: []string{"foregroundDeletion"}}}, pod, false},
		{"node no longer selected", func() *appsv1.DaemonSet {
			d := &appsv1.DaemonSet{}
			d.Spec.Template.Spec.NodeSelector = map[string]string{"pool": "gpu"}
			return d
		}(), pod, false},
		{"pod name names no DaemonSet", &appsv1.DaemonSet{}, "standalone", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = tt.pod, ns
			if tt.ds != nil {
				tt.ds.Name, tt.ds.Namespace = dsName, ns
				if _, err := e.kube.AppsV1().DaemonSets(ns).Create(context.Background(), tt.ds, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			done := e.startWatch("--refresh-interval=10ms", "app:1")
			waitFor(t, "label succeeded", e.labelIs("succeeded"))
			if code := e.sigterm(done); code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			n := e.node(testNode)
			_, hasLabel := n.Labels[testKey]
			_, hasAnn := n.Annotations[testKey]
			if hasLabel != tt.wantLabel || hasAnn != tt.wantLabel {
				t.Errorf("label %v annotation %v after SIGTERM, want %v", hasLabel, hasAnn, tt.wantLabel)
			}
			if tt.wantLabel && n.Labels[testKey] != "succeeded" {
				t.Errorf("label %q, want succeeded kept", n.Labels[testKey])
			}
			e.assertOthersUntouched()
		})
	}
}

// A rollout with a changed list: the node already carries the key from
// the previous pods. Until the new images are there, the label says failed
// with them as Missing; then succeeded. On a node without the key, nothing
// is written before the pull ends.
func TestFetchLabelWhileAChangedListIsPulled(t *testing.T) {
	for _, labeled := range []bool{true, false} {
		t.Run(map[bool]string{true: "key kept from the previous pods", false: "first install"}[labeled], func(t *testing.T) {
			e := newEnv(t)
			e.cri.AddImage("docker.io/library/old:1", 1)
			if labeled {
				if code := e.run(e.agentArgs("fetch", "old:1")...); code != 0 {
					t.Fatalf("exit %d", code)
				}
			}
			ref := "docker.io/library/new:1"
			pulling := make(chan struct{})
			release := make(chan struct{})
			e.cri.SetBehavior(ref, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
				close(pulling)
				<-release
				return nil
			})
			done := make(chan int, 1)
			go func() { done <- e.run(e.agentArgs("fetch", "old:1", "new:1")...) }()
			<-pulling
			v, s, ok := e.state()
			if labeled {
				if v != "failed" || s.Present != 1 || len(s.Failed) != 1 || s.Failed[0].Image != "new:1" || s.Failed[0].Reason != "Missing" {
					t.Errorf("while pulling: label %q summary %+v, want failed with new:1 Missing", v, s)
				}
			} else if ok || v != "" {
				t.Errorf("while pulling on a new node: label %q, want none yet", v)
			}
			close(release)
			if code := <-done; code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			if v, s, _ := e.state(); v != "succeeded" || s.Present != 2 {
				t.Errorf("after: label %q summary %+v", v, s)
			}
			e.assertOthersUntouched()
		})
	}
}
