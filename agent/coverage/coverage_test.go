package coverage

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
)

func TestDaemonSetName(t *testing.T) {
	tests := []struct {
		pod, want string
		ok        bool
	}{
		{"image-prefetcher-demo-x7k2p", "image-prefetcher-demo", true},
		{"a-b-c-zzzzz", "a-b-c", true},
		{"nodash", "", false},
		{"image-prefetcher-demo-abc", "", false}, // not a generated suffix
		{"-abcde", "", false},
		// generateName longer than 58 characters is cut by the apiserver.
		{"a123456789012345678901234567890123456789012345678901234567-abcde", "", false},
		{"a12345678901234567890123456789012345678901234567890123456-abcde", "a12345678901234567890123456789012345678901234567890123456", true},
	}
	for _, tt := range tests {
		got, ok := DaemonSetName(tt.pod)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: %q %v, want %q %v", tt.pod, got, ok, tt.want, tt.ok)
		}
	}
}

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

func TestCovers(t *testing.T) {
	now := metav1.Now()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "gpu"}}}
	ds := func(mod func(*appsv1.DaemonSet)) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-demo", Namespace: "ns"}}
		if mod != nil {
			mod(d)
		}
		return d
	}
	tests := []struct {
		name    string
		objects []any
		pod     string
		want    bool
		wantErr bool
	}{
		{"rollout: still selected", []any{node, ds(nil)}, "image-prefetcher-demo-x7k2p", true, false},
		{"deleted", []any{node}, "image-prefetcher-demo-x7k2p", false, false},
		{"being deleted", []any{node, ds(func(d *appsv1.DaemonSet) {
			d.DeletionTimestamp, d.Finalizers = &now, []string{"x"}
		})}, "image-prefetcher-demo-x7k2p", false, false},
		{"node no longer selected", []any{node, ds(func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.NodeSelector = map[string]string{"pool": "cpu"}
		})}, "image-prefetcher-demo-x7k2p", false, false},
		{"node gone", []any{ds(nil)}, "image-prefetcher-demo-x7k2p", false, false},
		{"pod name tells nothing", []any{node, ds(nil)}, "standalone", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset()
			for _, o := range tt.objects {
				switch o := o.(type) {
				case *corev1.Node:
					_, _ = cs.CoreV1().Nodes().Create(context.Background(), o, metav1.CreateOptions{})
				case *appsv1.DaemonSet:
					_, _ = cs.AppsV1().DaemonSets("ns").Create(context.Background(), o, metav1.CreateOptions{})
				}
			}
			k := clientset.Wrap(cs)
			c := Checker{DaemonSets: k.(kube.DaemonSetGetter).DaemonSets("ns"), Nodes: k.Nodes(), Pod: tt.pod, Node: "n1"}
			got, why, err := c.Covers(context.Background())
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("Covers = %v (%s), %v; want %v, error %v", got, why, err, tt.want, tt.wantErr)
			}
		})
	}
}
