// Package clientset adapts a client-go clientset, such as the fake one the
// tests use, to kube.Interface. The agent binary must not import it: it
// would bring client-go's whole typed clientset back (see
// agent/cmd/image-prefetcher's dependency test).
package clientset

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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

// ConfigMaps returns the clientset's ConfigMaps.
func (w wrapped) ConfigMaps(namespace string) kube.ConfigMapClient {
	return w.cs.CoreV1().ConfigMaps(namespace)
}

// DaemonSets returns the fake's DaemonSets as the agent reads them.
func (w wrapped) DaemonSets(namespace string) kube.DaemonSetClient {
	return daemonSets{w.cs.AppsV1().DaemonSets(namespace)}
}

type daemonSets struct {
	c interface {
		Get(ctx context.Context, name string, opts metav1.GetOptions) (*appsv1.DaemonSet, error)
		List(ctx context.Context, opts metav1.ListOptions) (*appsv1.DaemonSetList, error)
	}
}

func (d daemonSets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*kube.DaemonSet, error) {
	ds, err := d.c.Get(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	return convert(ds), nil
}

func (d daemonSets) List(ctx context.Context, opts metav1.ListOptions) (*kube.DaemonSetList, error) {
	l, err := d.c.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := &kube.DaemonSetList{Items: []kube.DaemonSet{}}
	for i := range l.Items {
		out.Items = append(out.Items, *convert(&l.Items[i]))
	}
	return out, nil
}

func convert(ds *appsv1.DaemonSet) *kube.DaemonSet {
	out := &kube.DaemonSet{ObjectMeta: ds.ObjectMeta}
	out.Spec.Template.Metadata.Annotations = ds.Spec.Template.Annotations
	pod := ds.Spec.Template.Spec
	out.Spec.Template.Spec.NodeName = pod.NodeName
	out.Spec.Template.Spec.NodeSelector = pod.NodeSelector
	out.Spec.Template.Spec.Affinity = pod.Affinity
	out.Spec.Template.Spec.Tolerations = pod.Tolerations
	out.Spec.Template.Spec.Volumes = pod.Volumes
	return out
}

// Pods returns the fake's Pods' metadata as the agent reads it.
func (w wrapped) Pods(namespace string) kube.PodClient {
	return pods{w.cs.CoreV1().Pods(namespace)}
}

type pods struct {
	c interface {
		Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	}
}

func (p pods) GetMetadata(ctx context.Context, name string) (*metav1.ObjectMeta, error) {
	pod, err := p.c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return &pod.ObjectMeta, nil
}
