package cli

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
)

// The herd is the DaemonSet's desired pod count, read through the pod's
// name; whatever cannot be told is 0, which the slots treat as unknown.
func TestHerdSize(t *testing.T) {
	const ns, pod = "prefetch", "image-prefetcher-demo-x7k2p"
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-demo", Namespace: ns}}
	ds.Status.DesiredNumberScheduled = 1000
	tests := []struct {
		name string
		kube kube.Interface
		ns   string
		pod  string
		want int
	}{
		{"the DaemonSet's desired pods", clientset.Wrap(fake.NewSimpleClientset(ds)), ns, pod, 1000},
		{"no such DaemonSet", clientset.Wrap(fake.NewSimpleClientset()), ns, pod, 0},
		{"a pod name that names no DaemonSet", clientset.Wrap(fake.NewSimpleClientset(ds)), ns, "standalone", 0},
		{"no namespace", clientset.Wrap(fake.NewSimpleClientset(ds)), "", pod, 0},
		{"a client without DaemonSets", nodesOnly{}, ns, pod, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HerdSize(context.Background(), tt.kube, tt.ns, tt.pod, nil); got != tt.want {
				t.Errorf("HerdSize %d, want %d", got, tt.want)
			}
		})
	}
}

// nodesOnly is a kube.Interface that cannot read DaemonSets.
type nodesOnly struct{ kube.Interface }
