package hits

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// Client is what the view reads, with the credentials of the user who runs
// `status`: list Events of every namespace, list DaemonSets and get
// ConfigMaps of the instances' namespaces. The agent's ServiceAccount may
// do none of this.
type Client interface {
	Events(namespace string) kube.EventClient
	kube.DaemonSetGetter
	kube.ConfigMapGetter
}

// Want is an instance to view.
type Want struct {
	Instance string
	// Namespace is the instance's; empty when not known.
	Namespace string
}

// The instance's objects carry the function's labels (fn/render.Labels).
const (
	labelName     = "app.kubernetes.io/name"
	labelInstance = "app.kubernetes.io/instance"
	appName       = "image-prefetcher"
	kubelet       = "kubelet"
)

// Read builds the view of each wanted instance on nodes. An instance whose
// list cannot be read gets an Error; only a failure to list the kubelet's
// Events fails the whole view.
func Read(ctx context.Context, c Client, nodes []corev1.Node, domain string, want []Want) (Report, error) {
	var pulled []corev1.Event
	for _, reason := range []string{reasonPulled, reasonPulling} {
		evs, err := listEvents(ctx, c.Events(""), "reason="+reason+",source="+kubelet)
		if err != nil {
			return Report{}, fmt.Errorf("list the kubelet's %s Events of every namespace (status --hits needs list on events cluster-wide): %w", reason, err)
		}
		pulled = append(pulled, evs...)
	}
	r := Report{Since: Oldest(pulled), Instances: []Instance{}}
	byNamespace := map[string][]corev1.Event{}
	for _, w := range want {
		inst, err := read(ctx, c, w, byNamespace)
		if err != nil {
			r.Instances = append(r.Instances, Instance{Instance: w.Instance, Namespace: w.Namespace, Nodes: []Node{}, Error: err.Error()})
			continue
		}
		inst.Kubelet, inst.Nodes, inst.Key = pulled, nodes, label.Key(domain, w.Instance)
		r.Instances = append(r.Instances, Build(inst))
	}
	r.noteMisses()
	return r, nil
}

func read(ctx context.Context, c Client, w Want, byNamespace map[string][]corev1.Event) (Source, error) {
	if w.Namespace == "" {
		return Source{}, fmt.Errorf("its namespace is not known (no node's annotation names the owner): pass --namespace")
	}
	ds, list, err := readList(ctx, c, w.Namespace, w.Instance)
	if err != nil {
		return Source{}, err
	}
	agent, seen := byNamespace[w.Namespace]
	if !seen {
		agent, err = listEvents(ctx, c.Events(w.Namespace), "source="+events.Component)
		if err != nil {
			return Source{}, fmt.Errorf("list the agent's Events in %s: %w", w.Namespace, err)
		}
		byNamespace[w.Namespace] = agent
	}
	return Source{Instance: w.Instance, Namespace: w.Namespace, DaemonSet: ds, List: list, Agent: agent}, nil
}

// readList finds the instance's DaemonSet by its labels, which a
// kustomize namePrefix leaves alone, and reads the list ConfigMap its
// pods mount, whatever its name (generator mode adds a hash).
func readList(ctx context.Context, c Client, namespace, instance string) (string, imagelist.List, error) {
	sel := labelName + "=" + appName + "," + labelInstance + "=" + instance
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := c.DaemonSets(namespace).List(lctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return "", imagelist.List{}, fmt.Errorf("find its DaemonSet in %s: %w", namespace, err)
	}
	if len(l.Items) != 1 {
		var names []string
		for _, d := range l.Items {
			names = append(names, d.Name)
		}
		return "", imagelist.List{}, fmt.Errorf("%d DaemonSets in %s are labeled %s (%s), want 1", len(l.Items), namespace, sel, strings.Join(names, ", "))
	}
	ds := l.Items[0]
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name != v1alpha1.ImageListVolume || v.ConfigMap == nil {
			continue
		}
		cm, err := c.ConfigMaps(namespace).Get(lctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return "", imagelist.List{}, fmt.Errorf("read its image list: %w", err)
		}
		return ds.Name, imagelist.Parse(cm.Data[v1alpha1.ImageListKey]), nil
	}
	return "", imagelist.List{}, fmt.Errorf("DaemonSet %s/%s has no ConfigMap volume %q: not rendered by image-prefetcher-fn", namespace, ds.Name, v1alpha1.ImageListVolume)
}

// listEvents lists the Events that match a field selector, 500 a page.
func listEvents(ctx context.Context, c kube.EventClient, fieldSelector string) ([]corev1.Event, error) {
	var out []corev1.Event
	opts := metav1.ListOptions{FieldSelector: fieldSelector, Limit: 500}
	for {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		l, err := c.List(lctx, opts)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, l.Items...)
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}
