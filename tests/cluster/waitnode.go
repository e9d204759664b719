package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// LabelIs holds when key's label is value and, unless reason is empty,
// an image of its annotation failed with reason.
func LabelIs(key, value, reason string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		if n.Labels[key] != value {
			return false
		}
		if reason == "" {
			return true
		}
		s, err := label.Parse(n.Annotations[key])
		if err != nil {
			return false
		}
		for _, f := range s.Failed {
			if f.Reason == reason {
				return true
			}
		}
		return false
	}
}

// HasTaint reports whether n carries a taint with key, of any effect.
func HasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// WaitNode watches the Node name until cond holds for it, and returns it:
// each change is seen as it is made, with no polling. ctx bounds the wait.
func (c *Cluster) WaitNode(ctx context.Context, name string, cond func(*corev1.Node) bool) (*corev1.Node, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return nil, fmt.Errorf("get node %s: %w", name, err)
		}
		if len(list.Items) == 1 && cond(&list.Items[0]) {
			return &list.Items[0], nil
		}
		w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return nil, fmt.Errorf("watch node %s: %w", name, err)
		}
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && ev.Type != watch.Deleted && cond(n) {
				w.Stop()
				return n, nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("node %s: %w", name, ctx.Err())
		}
		// The watch closed (the apiserver ends watches now and then): list
		// again and go on.
	}
}
