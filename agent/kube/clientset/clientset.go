// Package clientset adapts a client-go clientset, such as the fake one the
// tests use, to kube.Interface. The agent binary must not import it: it
// would bring client-go's whole typed clientset back (see
// agent/cmd/image-prefetcher's dependency test).
package clientset

import (
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
