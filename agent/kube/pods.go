package kube

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// PodClient reads the metadata of Pods in one namespace: the agent reads
// its own pod's owner references to find its DaemonSet.
type PodClient interface {
	GetMetadata(ctx context.Context, name string) (*metav1.ObjectMeta, error)
}

// PodGetter is implemented by clients that can read Pods; like
// DaemonSetGetter it is kept apart from Interface.
type PodGetter interface {
	Pods(namespace string) PodClient
}

var _ PodGetter = (*Client)(nil)

// Pods returns the Pod metadata client of a namespace.
func (c *Client) Pods(namespace string) PodClient { return pods{c: c.core, ns: namespace} }

type pods struct {
	c  rest.Interface
	ns string
}

// partialMetadata asks the apiserver for the object's metadata only: the
// pod's spec and status are neither sent nor decoded, and the agent needs
// no core/v1 Pod type in its scheme.
const partialMetadata = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

func (p pods) GetMetadata(ctx context.Context, name string) (*metav1.ObjectMeta, error) {
	res := p.c.Get().Namespace(p.ns).Resource("pods").Name(name).SetHeader("Accept", partialMetadata).Do(ctx)
	if err := res.Error(); err != nil {
		return nil, err
	}
	raw, err := res.Raw()
	if err != nil {
		return nil, err
	}
	var out metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("decode pod %s/%s: %w", p.ns, name, err)
	}
	return &out.ObjectMeta, nil
}
