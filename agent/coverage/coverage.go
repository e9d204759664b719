// Package coverage tells whether an instance still covers a node: whether
// its DaemonSet exists, is not being deleted, and still selects the node.
// watch keeps its node key across a rollout (the DaemonSet is replaced pod
// by pod, and the images stay) and removes it only when the instance stops
// covering the node.
package coverage

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// generatedSuffix is the length of the random part the apiserver appends
// to a DaemonSet pod's generateName ("<daemonset>-").
const generatedSuffix = 5

// maxGeneratedBase is the longest generateName the apiserver keeps whole;
// a longer one is cut, and the DaemonSet's name can no longer be told.
const maxGeneratedBase = 63 - generatedSuffix

// DaemonSetName returns the name of the DaemonSet that created a pod, from
// the pod's name: the DaemonSet controller names its pods by generateName
// "<daemonset>-". ok is false when the name cannot be told.
func DaemonSetName(pod string) (string, bool) {
	i := strings.LastIndexByte(pod, '-')
	if i <= 0 || len(pod)-i-1 != generatedSuffix || i+1 > maxGeneratedBase {
		return "", false
	}
	return pod[:i], true
}

// Checker asks the API server whether this instance still covers a node.
type Checker struct {
	DaemonSets kube.DaemonSetClient
	Nodes      kube.NodeClient
	// Pod is the agent's own pod, created by the instance's DaemonSet.
	Pod  string
	Node string
}

// Covers reports whether the instance's DaemonSet still covers the node,
// and why. An error means it could not be told.
func (c Checker) Covers(ctx context.Context) (bool, string, error) {
	name, ok := DaemonSetName(c.Pod)
	if !ok {
		return false, "", fmt.Errorf("cannot tell the DaemonSet from the pod name %q", c.Pod)
	}
	ds, err := c.DaemonSets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, fmt.Sprintf("DaemonSet %s was deleted", name), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get DaemonSet %s: %w", name, err)
	}
	if ds.DeletionTimestamp != nil {
		return false, fmt.Sprintf("DaemonSet %s is being deleted", name), nil
	}
	node, err := c.Nodes.Get(ctx, c.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, fmt.Sprintf("node %s is gone", c.Node), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get node %s: %w", c.Node, err)
	}
	if !Selects(ds, node) {
		return false, fmt.Sprintf("DaemonSet %s no longer selects node %s (nodeSelector or node affinity)", name, c.Node), nil
	}
	return true, fmt.Sprintf("DaemonSet %s still selects node %s (a rollout or a pod restart)", name, c.Node), nil
}

// Selects reports whether the DaemonSet's pod template may run on node, by
// its nodeSelector and its required node affinity, as the DaemonSet
// controller decides (taints are not considered).
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
