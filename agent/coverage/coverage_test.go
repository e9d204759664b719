package coverage

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
)

func affinity(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
}

func expr(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func TestSelects(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "gpu", "zone": "a", "cores": "16"}}}
	tests := []struct {
		name     string
		selector map[string]string
		affinity *corev1.Affinity
		want     bool
	}{
		{"nothing", nil, nil, true},
		{"selector matches", map[string]string{"pool": "gpu"}, nil, true},
		{"selector differs", map[string]string{"pool": "cpu"}, nil, false},
		{"selector key missing", map[string]string{"gpu": "true"}, nil, false},
		{"affinity In", nil, affinity(expr("zone", corev1.NodeSelectorOpIn, "a", "b")), true},
		{"affinity In other", nil, affinity(expr("zone", corev1.NodeSelectorOpIn, "c")), false},
		{"affinity NotIn", nil, affinity(expr("zone", corev1.NodeSelectorOpNotIn, "a")), false},
		{"affinity NotIn absent key", nil, affinity(expr("rack", corev1.NodeSelectorOpNotIn, "r1")), true},
		{"affinity Exists", nil, affinity(expr("pool", corev1.NodeSelectorOpExists)), true},
		{"affinity DoesNotExist", nil, affinity(expr("pool", corev1.NodeSelectorOpDoesNotExist)), false},
		{"affinity Gt", nil, affinity(expr("cores", corev1.NodeSelectorOpGt, "8")), true},
		{"affinity Lt", nil, affinity(expr("cores", corev1.NodeSelectorOpLt, "8")), false},
		{"terms are ORed", nil, affinity(expr("zone", corev1.NodeSelectorOpIn, "c"), expr("pool", corev1.NodeSelectorOpIn, "gpu")), true},
		{"empty term matches nothing", nil, affinity(corev1.NodeSelectorTerm{}), false},
		{"no terms", nil, affinity(), false},
		{"field metadata.name", nil, affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}}), true},
		{"field other node", nil, affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}}), false},
		{"selector and affinity both", map[string]string{"pool": "gpu"}, affinity(expr("zone", corev1.NodeSelectorOpIn, "c")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := &kube.DaemonSet{}
			ds.Spec.Template.Spec.NodeSelector = tt.selector
			ds.Spec.Template.Spec.Affinity = tt.affinity
			if got := Selects(ds, node); got != tt.want {
				t.Errorf("Selects = %v, want %v", got, tt.want)
			}
		})
	}
}

// A running DaemonSet pod stays where the controller would keep it: its
// template still selects the node, and every NoExecute taint is tolerated,
// by the template or by the tolerations the controller adds to every
// DaemonSet pod (not-ready, unreachable).
func TestCovers(t *testing.T) {
	node := func(taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "gpu"}}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	noExec := corev1.Taint{Key: "maintenance", Value: "x", Effect: corev1.TaintEffectNoExecute}
	tests := []struct {
		name        string
		node        *corev1.Node
		nodeName    string
		tolerations []corev1.Toleration
		want        bool
	}{
		{"no taints", node(), "", nil, true},
		{"NoSchedule does not evict", node(corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectNoSchedule}), "", nil, true},
		{"PreferNoSchedule does not evict", node(corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectPreferNoSchedule}), "", nil, true},
		{"untolerated NoExecute evicts", node(noExec), "", nil, false},
		{"tolerated by key", node(noExec), "", []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}, true},
		{"tolerated by everything", node(noExec), "", []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, true},
		{"a toleration of another value", node(noExec), "", []corev1.Toleration{{Key: "maintenance", Value: "y"}}, false},
		{"a toleration of NoSchedule only", node(noExec), "", []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}, false},
		{"tolerationSeconds still tolerates, as the controller reads it", node(noExec), "", []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists, TolerationSeconds: new(int64)}}, true},
		{"not-ready is tolerated by every DaemonSet pod", node(corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}), "", nil, true},
		{"unreachable too", node(corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}), "", nil, true},
		{"out-of-service is not", node(corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}), "", nil, false},
		{"nodeName of another node", node(), "n2", nil, false},
		{"nodeName of this node", node(), "n1", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := &kube.DaemonSet{}
			ds.Spec.Template.Spec.NodeName = tt.nodeName
			ds.Spec.Template.Spec.Tolerations = tt.tolerations
			if got, why := Covers(ds, tt.node); got != tt.want {
				t.Errorf("Covers = %v (%s), want %v", got, why, tt.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	const ns, list = "ns", "0123456789abcdef"
	now := metav1.Now()
	yes := true
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "gpu"}}}
	ds := func(mod func(*appsv1.DaemonSet)) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "x-image-prefetcher-demo", Namespace: ns, UID: "u1"}}
		d.Spec.Template.Annotations = map[string]string{"image-prefetcher.stackrox.io/list-digest": list}
		if mod != nil {
			mod(d)
		}
		return d
	}
	pod := func(owner string, uid types.UID) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x-image-prefetcher-dem-x7k2p", Namespace: ns}}
		if owner != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: owner, UID: uid, Controller: &yes}}
		}
		return p
	}
	owned := pod("x-image-prefetcher-demo", "u1")
	tests := []struct {
		name    string
		objects []runtime.Object
		want    Verdict
		wantErr bool
	}{
		{"rollout with the same list", []runtime.Object{node, owned, ds(nil)}, Kept, false},
		{"rollout with another list", []runtime.Object{node, owned, ds(func(d *appsv1.DaemonSet) {
			d.Spec.Template.Annotations["image-prefetcher.stackrox.io/list-digest"] = "fedcba9876543210"
		})}, ListChanged, false},
		{"a template without a digest", []runtime.Object{node, owned, ds(func(d *appsv1.DaemonSet) { d.Spec.Template.Annotations = nil })}, ListChanged, false},
		{"deleted", []runtime.Object{node, owned}, Gone, false},
		{"deleted and created again", []runtime.Object{node, pod("x-image-prefetcher-demo", "u0"), ds(nil)}, Gone, false},
		{"being deleted", []runtime.Object{node, owned, ds(func(d *appsv1.DaemonSet) {
			d.DeletionTimestamp, d.Finalizers = &now, []string{"x"}
		})}, Gone, false},
		{"node no longer selected", []runtime.Object{node, owned, ds(func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.NodeSelector = map[string]string{"pool": "cpu"}
		})}, Gone, false},
		{"node gone", []runtime.Object{owned, ds(nil)}, Gone, false},
		{"a pod without a DaemonSet", []runtime.Object{node, pod("", ""), ds(nil)}, Gone, false},
		{"own pod not readable", []runtime.Object{node, ds(nil)}, Gone, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Checker{Client: clientset.Wrap(fake.NewClientset(tt.objects...)), Namespace: ns, Pod: owned.Name, Node: "n1", List: list}
			got, why, err := c.Check(context.Background())
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("Check = %v (%s), %v; want %v, error %v", got, why, err, tt.want, tt.wantErr)
			}
		})
	}
	if _, _, err := (Checker{Client: nodesOnly{}, Namespace: ns, Pod: owned.Name, Node: "n1"}).Check(context.Background()); err == nil {
		t.Error("a client that cannot read pods told a verdict")
	}
}

// nodesOnly is a kube.Interface that cannot read pods or DaemonSets.
type nodesOnly struct{ kube.Interface }
