package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

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

// WatchNode calls seen, from one goroutine, with every version of the Node
// name after resource version rv, until ctx ends or stop is called. The
// apiserver ends watches now and then (a cache re-initialised, a timeout);
// the watch is resumed from the last version seen, as client-go's
// RetryWatcher does, so that a change that comes and goes within a second
// is never missed. stop returns an error when versions were lost (the
// resumed watch answered 410 Gone).
func (c *Cluster) WatchNode(ctx context.Context, name, rv string, seen func(*corev1.Node)) (stop func() error, err error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	ctx, cancel := context.WithCancel(ctx)
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = sel
		return cs.CoreV1().Nodes().Watch(ctx, o)
	}})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch node %s: %w", name, err)
	}
	var lost error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range rw.ResultChan() {
			switch o := ev.Object.(type) {
			case *corev1.Node:
				if ev.Type == watch.Added || ev.Type == watch.Modified {
					seen(o)
				}
			case *metav1.Status:
				if ctx.Err() == nil {
					lost = fmt.Errorf("watch of node %s lost versions: %s", name, o.Message)
				}
			}
		}
	}()
	return func() error {
		cancel()
		rw.Stop()
		<-done
		return lost
	}, nil
}
