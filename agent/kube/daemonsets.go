package kube

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// DaemonSet is the part of an apps/v1 DaemonSet the agent reads: whether
// it is being deleted, which nodes its pods may run on and stay on, which
// image list its pod template carries, and how many pods it wants; and
// for `status --hits`, its volumes (the list ConfigMap). It is decoded
// from JSON rather than through k8s.io/api/apps/v1, whose types the agent
// binary does not otherwise need (see the package comment on footprint).
type DaemonSet struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              DaemonSetSpec `json:"spec"`
}

// DaemonSetSpec holds the pod template's annotations, node selection and
// volumes.
type DaemonSetSpec struct {
	Template struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"metadata"`
		Spec struct {
			NodeName     string              `json:"nodeName,omitempty"`
			NodeSelector map[string]string   `json:"nodeSelector,omitempty"`
			Affinity     *corev1.Affinity    `json:"affinity,omitempty"`
			Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
			Volumes      []corev1.Volume     `json:"volumes,omitempty"`
		} `json:"spec"`
	} `json:"template"`
}

// DaemonSetList is a list of DaemonSets.
type DaemonSetList struct {
	Items []DaemonSet `json:"items"`
}

// DaemonSetClient reads DaemonSets of one namespace.
type DaemonSetClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*DaemonSet, error)
	List(ctx context.Context, opts metav1.ListOptions) (*DaemonSetList, error)
}

// DaemonSetGetter is implemented by clients that can read DaemonSets. It is
// kept apart from Interface so that clients of the other calls need not.
type DaemonSetGetter interface {
	DaemonSets(namespace string) DaemonSetClient
}

var appsV1 = schema.GroupVersion{Group: "apps", Version: "v1"}

// DaemonSets returns the DaemonSet client of a namespace.
func (c *Client) DaemonSets(namespace string) DaemonSetClient {
	return daemonSets{c: c.apps, ns: namespace}
}

type daemonSets struct {
	c  rest.Interface
	ns string
}

func (d daemonSets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*DaemonSet, error) {
	// GetOptions holds one field; it is set by hand so that apps/v1 needs
	// no registration in the scheme, which costs every start.
	req := d.c.Get().Namespace(d.ns).Resource("daemonsets").Name(name)
	if opts.ResourceVersion != "" {
		req = req.Param("resourceVersion", opts.ResourceVersion)
	}
	out := &DaemonSet{}
	if err := decodeJSON(req.Do(ctx), out, "DaemonSet "+d.ns+"/"+name); err != nil {
		return nil, err
	}
	return out, nil
}

// List reads the DaemonSets of the namespace that match opts.LabelSelector,
// the only option it sends.
func (d daemonSets) List(ctx context.Context, opts metav1.ListOptions) (*DaemonSetList, error) {
	req := d.c.Get().Namespace(d.ns).Resource("daemonsets")
	if opts.LabelSelector != "" {
		req = req.Param("labelSelector", opts.LabelSelector)
	}
	out := &DaemonSetList{}
	if err := decodeJSON(req.Do(ctx), out, "DaemonSets of "+d.ns); err != nil {
		return nil, err
	}
	return out, nil
}

// decodeJSON returns the apiserver's error as it is, so that
// apierrors.IsNotFound and the like still work on it.
func decodeJSON(res rest.Result, into any, what string) error {
	// Error, unlike Raw, decodes the apiserver's Status: its reason and
	// message, not just one made up from the HTTP code.
	if err := res.Error(); err != nil {
		return err
	}
	raw, err := res.Raw()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("decode %s: %w", what, err)
	}
	return nil
}
