// Package coverage finds the agent's own DaemonSet and tells whether it
// still covers the agent's node with the agent's list. watch keeps its
// node key across a rollout that keeps the list (the DaemonSet is replaced
// pod by pod, and the images stay), marks it failed when the new template
// carries another list, and removes it when the instance stops covering
// the node.
package coverage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Client is what finding the own DaemonSet reads: the pod's metadata, then
// the DaemonSet its controller reference names.
type Client interface {
	kube.PodGetter
	kube.DaemonSetGetter
}

// ErrNotOwned: the pod has no DaemonSet as its controller (it was started
// by hand, or orphaned when its DaemonSet was deleted with
// --cascade=orphan).
var ErrNotOwned = errors.New("the pod is not controlled by a DaemonSet")

// Own returns the name of the DaemonSet that controls pod in namespace ns,
// from the pod's controller owner reference, and that DaemonSet; ds is nil
// (and err too) when the DaemonSet is gone. The pod's name is never parsed:
// the apiserver cuts a generateName of more than 58 characters, and a
// namePrefix applied after the function renames the DaemonSet.
func Own(ctx context.Context, k kube.Interface, ns, pod string) (name string, ds *kube.DaemonSet, err error) {
	c, ok := k.(Client)
	if !ok || ns == "" || pod == "" {
		return "", nil, errors.New("the pod's name and namespace, or a client that reads pods and DaemonSets, are missing")
	}
	meta, err := c.Pods(ns).GetMetadata(ctx, pod)
	if err != nil {
		return "", nil, fmt.Errorf("get own pod %s/%s: %w", ns, pod, err)
	}
	ref := metav1.GetControllerOfNoCopy(meta)
	if ref == nil || ref.Kind != "DaemonSet" || ref.APIVersion != "apps/v1" {
		return "", nil, fmt.Errorf("pod %s/%s: %w", ns, pod, ErrNotOwned)
	}
	ds, err = c.DaemonSets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ref.Name, nil, nil
	}
	if err != nil {
		return ref.Name, nil, fmt.Errorf("get DaemonSet %s: %w", ref.Name, err)
	}
	if ds.UID != ref.UID {
		// Deleted and created again under the same name: the pod belongs
		// to the old one, which is gone.
		return ref.Name, nil, nil
	}
	return ref.Name, ds, nil
}

// Verdict is what watch does with its key on SIGTERM.
type Verdict int

const (
	// Gone: the instance no longer covers the node; remove the key.
	Gone Verdict = iota
	// Kept: the DaemonSet still covers the node with this pod's list (a
	// rollout or a pod restart); keep the key.
	Kept
	// ListChanged: the DaemonSet still covers the node, but its current
	// template carries another list, not checked on this node yet; the key
	// must say failed until the next pod checked it.
	ListChanged
)

// Checker asks the API server what becomes of the instance's key on a node.
type Checker struct {
	Client kube.Interface
	// Namespace and Pod are the agent's own pod's.
	Namespace, Pod string
	Node           string
	// List is the digest of the list this pod checked
	// (imagelist.List.Digest).
	List string
}

// Check tells what becomes of the key, and why. An error means it could
// not be told.
func (c Checker) Check(ctx context.Context) (Verdict, string, error) {
	name, ds, err := Own(ctx, c.Client, c.Namespace, c.Pod)
	if errors.Is(err, ErrNotOwned) {
		return Gone, err.Error(), nil
	}
	if err != nil {
		return Gone, "", err
	}
	if ds == nil {
		return Gone, fmt.Sprintf("DaemonSet %s was deleted", name), nil
	}
	if ds.DeletionTimestamp != nil {
		return Gone, fmt.Sprintf("DaemonSet %s is being deleted", name), nil
	}
	node, err := c.Client.Nodes().Get(ctx, c.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Gone, fmt.Sprintf("node %s is gone", c.Node), nil
	}
	if err != nil {
		return Gone, "", fmt.Errorf("get node %s: %w", c.Node, err)
	}
	if ok, why := Covers(ds, node); !ok {
		return Gone, fmt.Sprintf("DaemonSet %s no longer runs a pod on node %s: %s", name, c.Node, why), nil
	}
	switch got := ds.Spec.Template.Metadata.Annotations[v1alpha1.ListDigestAnnotation]; {
	case got == "":
		return ListChanged, fmt.Sprintf("DaemonSet %s's pod template names no image list (no %s annotation): its list cannot be compared with this pod's %s", name, v1alpha1.ListDigestAnnotation, c.List), nil
	case got != c.List:
		return ListChanged, fmt.Sprintf("DaemonSet %s's current pod template carries image list %s, this pod checked %s", name, got, c.List), nil
	}
	return Kept, fmt.Sprintf("DaemonSet %s still runs a pod on node %s with the same image list (a rollout or a pod restart)", name, c.Node), nil
}

// defaultTolerations are the NoExecute tolerations the DaemonSet
// controller adds to every pod it creates
// (k8s.io/kubernetes/pkg/controller/daemon/util.AddOrUpdateDaemonPodTolerations):
// a DaemonSet pod stays on a node that is not ready or unreachable.
var defaultTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
}

// Covers reports whether the DaemonSet keeps a pod on node, by the
// DaemonSet controller's rule for a pod that already runs there
// (NodeShouldRunDaemonPod's shouldContinueRunning): the template's
// nodeName, nodeSelector and required node affinity select the node, and
// no NoExecute taint of the node goes untolerated. A NoSchedule taint does
// not move a running pod; an untolerated NoExecute one gets it evicted,
// and the controller does not create another. why says what fails.
func Covers(ds *kube.DaemonSet, node *corev1.Node) (ok bool, why string) {
	spec := ds.Spec.Template.Spec
	if spec.NodeName != "" && spec.NodeName != node.Name {
		return false, fmt.Sprintf("the pod template's nodeName is %s", spec.NodeName)
	}
	if !Selects(ds, node) {
		return false, "the nodeSelector or the required node affinity no longer selects it"
	}
	tolerations := append(slices.Clone(spec.Tolerations), defaultTolerations...)
	for _, t := range node.Spec.Taints {
		if t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &t, false) }) {
			return false, fmt.Sprintf("the node's NoExecute taint %s=%s is not tolerated: the pod is evicted", t.Key, t.Value)
		}
	}
	return true, ""
}

// Selects reports whether the DaemonSet's pod template may run on node, by
// its nodeSelector and its required node affinity, as the DaemonSet
// controller decides.
func Selects(ds *kube.DaemonSet, node *corev1.Node) bool {
	spec := ds.Spec.Template.Spec
	for k, v := range spec.NodeSelector {
		if got, ok := node.Labels[k]; !ok || got != v {
			return false
		}
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	// The terms are ORed; an empty list selects no node.
	for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if matchTerm(term, node) {
			return true
		}
	}
	return false
}

// matchTerm ANDs a term's requirements; a term without any matches nothing.
func matchTerm(term corev1.NodeSelectorTerm, node *corev1.Node) bool {
	if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
		return false
	}
	for _, r := range term.MatchExpressions {
		if !match(r, node.Labels) {
			return false
		}
	}
	for _, r := range term.MatchFields {
		// metadata.name is the only field a node selector may name.
		if r.Key != "metadata.name" || !match(r, map[string]string{"metadata.name": node.Name}) {
			return false
		}
	}
	return true
}

func match(r corev1.NodeSelectorRequirement, labels map[string]string) bool {
	v, has := labels[r.Key]
	switch r.Operator {
	case corev1.NodeSelectorOpIn:
		return has && slices.Contains(r.Values, v)
	case corev1.NodeSelectorOpNotIn:
		return !has || !slices.Contains(r.Values, v)
	case corev1.NodeSelectorOpExists:
		return has
	case corev1.NodeSelectorOpDoesNotExist:
		return !has
	case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
		if !has || len(r.Values) != 1 {
			return false
		}
		got, err1 := strconv.ParseInt(v, 10, 64)
		want, err2 := strconv.ParseInt(r.Values[0], 10, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		if r.Operator == corev1.NodeSelectorOpGt {
			return got > want
		}
		return got < want
	}
	return false
}
