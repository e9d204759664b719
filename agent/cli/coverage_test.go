package cli

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
)

const listDigestAnnotation = "image-prefetcher.stackrox.io/list-digest"

// ownPod creates the agent's pod as the DaemonSet controller does: its
// name cut from generateName, its controller owner reference naming ds.
func (e *env) ownPod(ns, pod string, ds *appsv1.DaemonSet) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Pods(ns).Create(context.Background(), ownedPod(ns, pod, ds), metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = pod, ns
}

// generateNames makes the fake API server fill in generateName, as the
// real one does, so that it keeps every Event a pod records.
func (e *env) generateNames() {
	var n atomic.Int64
	e.kube.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if obj, ok := action.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && obj.GetName() == "" && obj.GetGenerateName() != "" {
			obj.SetName(fmt.Sprintf("%s%d", obj.GetGenerateName(), n.Add(1)))
		}
		return false, nil, nil
	})
}

// daemonSet is an instance's DaemonSet whose pod template carries the
// digest of list, as the function renders it.
func daemonSet(ns, name string, list ...string) *appsv1.DaemonSet {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: "ds-uid"}}
	if list != nil {
		ds.Spec.Template.Annotations = map[string]string{listDigestAnnotation: loadList("", list).Digest()}
	}
	return ds
}

// On SIGTERM, watch keeps the key only while the instance still covers
// the node by the DaemonSet controller's rules AND the DaemonSet's current
// template carries this pod's list; a changed list makes it failed
// (issue 26, findings 3, 6 and 7).
func TestWatchOnSIGTERMFollowsTheDaemonSet(t *testing.T) {
	const ns = "prefetch"
	long := strings.Repeat("a", 63)
	longDS := "image-prefetcher-" + long
	untolerated := corev1.Taint{Key: "maintenance", Value: "x", Effect: corev1.TaintEffectNoExecute}
	tests := []struct {
		name      string
		ds        *appsv1.DaemonSet
		pod       string
		taints    []corev1.Taint
		wantLabel string // "" for removed
		wantWhy   string // in the annotation when failed
	}{
		{"rollout keeping the list", daemonSet(ns, "image-prefetcher-demo", "app:1"), "image-prefetcher-demo-x7k2p", nil, "succeeded", ""},
		{"DaemonSet deleted", nil, "image-prefetcher-demo-x7k2p", nil, "", ""},
		{"DaemonSet being deleted", func() *appsv1.DaemonSet {
			d := daemonSet(ns, "image-prefetcher-demo", "app:1")
			now := metav1.Now()
			d.DeletionTimestamp, d.Finalizers = &now, []string{"foregroundDeletion"}
			return d
		}(), "image-prefetcher-demo-x7k2p", nil, "", ""},
		{"node no longer selected", func() *appsv1.DaemonSet {
			d := daemonSet(ns, "image-prefetcher-demo", "app:1")
			d.Spec.Template.Spec.NodeSelector = map[string]string{"pool": "gpu"}
			return d
		}(), "image-prefetcher-demo-x7k2p", nil, "", ""},
		{"rollout changing the list", daemonSet(ns, "image-prefetcher-demo", "app:2"), "image-prefetcher-demo-x7k2p", nil, "failed", "ListChanged"},
		{"a template without a list digest", daemonSet(ns, "image-prefetcher-demo"), "image-prefetcher-demo-x7k2p", nil, "failed", "ListChanged"},
		// The apiserver cuts a generateName to 58 characters: the pod name
		// no longer holds the DaemonSet's.
		{"a 63-character instance name", daemonSet(ns, longDS, "app:1"), longDS[:58] + "x7k2p", nil, "succeeded", ""},
		{"a namePrefix above the function", daemonSet(ns, "x-image-prefetcher-demo", "app:1"), "x-image-prefetcher-demo-x7k2p", nil, "succeeded", ""},
		{"an untolerated NoExecute taint evicts the pod", daemonSet(ns, "image-prefetcher-demo", "app:1"), "image-prefetcher-demo-x7k2p", []corev1.Taint{untolerated}, "", ""},
		{"a tolerated NoExecute taint", func() *appsv1.DaemonSet {
			d := daemonSet(ns, "image-prefetcher-demo", "app:1")
			d.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}
			return d
		}(), "image-prefetcher-demo-x7k2p", []corev1.Taint{untolerated}, "succeeded", ""},
		{"an untolerated NoSchedule taint: the pod stays", daemonSet(ns, "image-prefetcher-demo", "app:1"), "image-prefetcher-demo-x7k2p",
			[]corev1.Taint{{Key: "maintenance", Effect: corev1.TaintEffectNoSchedule}}, "succeeded", ""},
		{"the node-lifecycle's not-ready NoExecute, which every DaemonSet pod tolerates", daemonSet(ns, "image-prefetcher-demo", "app:1"), "image-prefetcher-demo-x7k2p",
			[]corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute}}, "succeeded", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.generateNames()
			if tt.ds != nil {
				if _, err := e.kube.AppsV1().DaemonSets(ns).Create(context.Background(), tt.ds, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				e.ownPod(ns, tt.pod, tt.ds)
			} else {
				e.ownPod(ns, tt.pod, daemonSet(ns, "image-prefetcher-demo"))
			}
			done := e.startWatch("--refresh-interval=10ms", "app:1")
			waitFor(t, "label succeeded", e.labelIs("succeeded"))
			if tt.taints != nil {
				n := e.node(testNode)
				n.Spec.Taints = tt.taints
				if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if code := e.sigterm(done); code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			n := e.node(testNode)
			if got := n.Labels[testKey]; got != tt.wantLabel {
				t.Errorf("label %q after SIGTERM, want %q\n%s", got, tt.wantLabel, e.logs)
			}
			if _, hasAnn := n.Annotations[testKey]; hasAnn != (tt.wantLabel != "") {
				t.Errorf("annotation present %v, want %v", hasAnn, tt.wantLabel != "")
			}
			if tt.wantWhy != "" && !strings.Contains(n.Annotations[testKey], tt.wantWhy) {
				t.Errorf("annotation %s does not say %s", n.Annotations[testKey], tt.wantWhy)
			}
			// Issue 38, finding 7: the marking is recorded as an Event too,
			// so that status --hits counts no pull after it under succeeded.
			if tt.wantLabel == "failed" {
				var marked bool
				for _, ev := range e.events(events.ReasonPrefetchFailed) {
					marked = marked || strings.Contains(ev.Message, tt.wantWhy)
				}
				if !marked {
					t.Errorf("no %s Event saying %s after the key was marked failed\n%s", events.ReasonPrefetchFailed, tt.wantWhy, e.logs)
				}
			}
			e.assertOthersUntouched()
		})
	}
}
