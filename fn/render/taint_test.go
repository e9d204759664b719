package render

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// The agent must run on the nodes that carry the startup taint: narrowed
// tolerations get one for the key, unless one already covers every effect.
func TestStartupTaintTolerations(t *testing.T) {
	const key = "example.com/warming"
	added := corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists}
	for _, tc := range []struct {
		name string
		in   []corev1.Toleration
		want []corev1.Toleration
		warn bool
	}{
		{"default tolerates everything", nil, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, false},
		{"tolerate none", []corev1.Toleration{}, []corev1.Toleration{added}, true},
		{"Exists on the key, any effect", []corev1.Toleration{{Key: key, Operator: corev1.TolerationOpExists}}, []corev1.Toleration{{Key: key, Operator: corev1.TolerationOpExists}}, false},
		{"Exists on every key", []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, false},
		{"the key, NoSchedule only", []corev1.Toleration{{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			[]corev1.Toleration{{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}, added}, true},
		{"the key with a value", []corev1.Toleration{{Key: key, Operator: corev1.TolerationOpEqual, Value: "x"}},
			[]corev1.Toleration{{Key: key, Operator: corev1.TolerationOpEqual, Value: "x"}, added}, true},
		{"another key", []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}, added}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := &v1alpha1.ImagePrefetcher{Spec: v1alpha1.Spec{Images: []string{"debian"}, Tolerations: tc.in, StartupTaint: &v1alpha1.StartupTaint{Key: key}}}
			ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
			c, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
			if probs.ExitCode() != 0 {
				t.Fatal(probs)
			}
			if !reflect.DeepEqual(c.Tolerations, tc.want) {
				t.Errorf("tolerations %v, want %v", c.Tolerations, tc.want)
			}
			warned := false
			for _, p := range probs {
				warned = warned || p.Severity == framework.Warning && p.Field.Path == "spec.tolerations"
			}
			if warned != tc.warn {
				t.Errorf("warning %v, want %v: %v", warned, tc.warn, probs)
			}
			if len(tc.in) > 0 && !reflect.DeepEqual(ip.Spec.Tolerations, tc.in) {
				t.Errorf("the input was changed: %v", ip.Spec.Tolerations)
			}
			if c.StartupTaint == nil || c.StartupTaint.Key != key || c.StartupTaint.MaxWait != 20*time.Minute {
				t.Errorf("startup taint %+v, want the key and the default maxWait", c.StartupTaint)
			}
		})
	}
}

// Taints another controller owns are refused, naming it: removing one
// would undo that controller's state.
func TestStartupTaintReservedKeys(t *testing.T) {
	for key, owner := range map[string]string{
		"node.kubernetes.io/not-ready":                   "node lifecycle",
		"node.kubernetes.io/unschedulable":               "node lifecycle",
		"node.kubernetes.io/out-of-service":              "node lifecycle",
		"node.cloudprovider.kubernetes.io/uninitialized": "cloud node controllers",
		"node.cloudprovider.kubernetes.io/shutdown":      "cloud node controllers",
		"node-role.kubernetes.io/control-plane":          "kubeadm",
		"node.alpha.kubernetes.io/notReady":              "node lifecycle",
		"ToBeDeletedByClusterAutoscaler":                 "cluster-autoscaler",
		"DeletionCandidateOfClusterAutoscaler":           "cluster-autoscaler",
		"karpenter.sh/disruption":                        "Karpenter",
		"karpenter.sh/disrupted":                         "Karpenter (karpenter.sh/disrupted",
		"node.cilium.io/agent-not-ready":                 "Cilium",
	} {
		t.Run(key, func(t *testing.T) {
			ip := &v1alpha1.ImagePrefetcher{Spec: v1alpha1.Spec{Images: []string{"debian"}, StartupTaint: &v1alpha1.StartupTaint{Key: key}}}
			ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
			_, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
			found := false
			for _, p := range probs {
				found = found || p.Severity == framework.Error && p.Field.Path == "spec.startupTaint.key" && strings.Contains(p.Message, owner)
			}
			if !found {
				t.Errorf("not refused naming %q: %v", owner, probs)
			}
		})
	}
	// The autoscaler's startup-taint domain is a subdomain of kubernetes.io
	// meant for exactly this.
	ip := &v1alpha1.ImagePrefetcher{Spec: v1alpha1.Spec{Images: []string{"debian"}, StartupTaint: &v1alpha1.StartupTaint{Key: "startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"}}}
	ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
	if _, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false }); probs.ExitCode() != 0 {
		t.Errorf("the cluster-autoscaler's startup-taint key refused: %v", probs)
	}
}
