package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// PodIdentity is what a pod of a DaemonSet authenticates with: a service
// account token bound to that pod, which carries the pod's node
// (authentication.kubernetes.io/node-name), as a projected token does.
type PodIdentity struct {
	Node, Pod, Token string
}

// CreateNodes creates Node objects with no kubelet behind them, for API
// tests at a scale no real nodes reach here. At most parallel requests
// run at once.
func (c *Cluster) CreateNodes(ctx context.Context, names []string, labels map[string]string, parallel int) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	return forEach(len(names), parallel, func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: labels}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", names[i], err)
		}
		return nil
	})
}

// PodIdentities creates, for every node, a pod of serviceAccount in
// namespace bound to that node (spec.nodeName; no kubelet runs it) and a
// token bound to the pod, valid for ttl. The pods are named
// <prefix><node>.
func (c *Cluster) PodIdentities(ctx context.Context, namespace, serviceAccount, prefix string, nodes []string, ttl time.Duration, parallel int) ([]PodIdentity, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	out := make([]PodIdentity, len(nodes))
	secs := int64(ttl / time.Second)
	err = forEach(len(nodes), parallel, func(i int) error {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + nodes[i], Namespace: namespace},
			Spec: corev1.PodSpec{
				NodeName:           nodes[i],
				ServiceAccountName: serviceAccount,
				Containers:         []corev1.Container{{Name: "agent", Image: PauseImage}},
			},
		}
		created, err := cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod for %s: %w", nodes[i], err)
		}
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: created.Name, UID: created.UID},
		}}
		tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, tr, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("token for pod %s: %w", created.Name, err)
		}
		out[i] = PodIdentity{Node: nodes[i], Pod: created.Name, Token: tok.Status.Token}
		return nil
	})
	return out, err
}

// forEach calls fn(0..n-1), at most parallel at once, and returns the
// errors joined.
func forEach(n, parallel int, fn func(i int) error) error {
	sem := make(chan struct{}, max(parallel, 1))
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// PodClient is a client authenticated as pod, with a token bound to it as
// the kubelet projects one: the apiserver and admission policies read the
// pod's name and node from it.
func (c *Cluster) PodClient(ctx context.Context, pod *corev1.Pod) (*kubernetes.Clientset, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	cfg, err := c.RESTConfigForToken(tr.Status.Token)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
