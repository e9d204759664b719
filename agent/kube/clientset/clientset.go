// Package clientset adapts a client-go clientset, such as the fake one the
// tests use, to kube.Interface. The agent binary must not import it: it
// would bring client-go's whole typed clientset back (see
// agent/cmd/image-prefetcher's dependency test).
package clientset

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// Wrap returns cs as a kube.Interface.
func Wrap(cs kubernetes.Interface) kube.Interface { return wrapped{cs} }

type wrapped struct{ cs kubernetes.Interface }

func (w wrapped) Nodes() kube.NodeClient { return w.cs.CoreV1().Nodes() }

func (w wrapped) Events(namespace string) kube.EventClient { return w.cs.CoreV1().Events(namespace) }

func (w wrapped) Leases(namespace string) kube.LeaseClient {
	return w.cs.CoordinationV1().Leases(namespace)
}

// DaemonSets returns the fake's DaemonSets as the agent reads them.
func (w wrapped) DaemonSets(namespace string) kube.DaemonSetClient {
	return daemonSets{w.cs.AppsV1().DaemonSets(namespace)}
}

type daemonSets struct {
	c interface {
		Get(ctx context.Context, name string, opts metav1.GetOptions) (*appsv1.DaemonSet, error)
	}
}

func (d daemonSets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*kube.DaemonSet, error) {
	ds, err := d.c.Get(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	out := &kube.DaemonSet{ObjectMeta: ds.ObjectMeta}
	out.Spec.Template.Spec.NodeSelector = ds.Spec.Template.Spec.NodeSelector
	out.Spec.Template.Spec.Affinity = ds.Spec.Template.Spec.Affinity
	out.Status.DesiredNumberScheduled = ds.Status.DesiredNumberScheduled
	return out, nil
}
