package render

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// TestStartupTaintAdmission applies an instance with spec.startupTaint to a
// real kube-apiserver, as rendered and renamed by a namePrefix above the
// function, and patches Nodes as the agent's
// ServiceAccount with the node-name extra of a pod-bound token. Removing
// taints with the instance's key from its own node is the only spec change
// allowed. (tests/readiness repeats the decisive cases with the token the
// kubelet mounted into a real agent pod.)
func TestStartupTaintAdmission(t *testing.T) {
	const (
		taintKey = "startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"
		labelKey = "image-prefetcher.stackrox.io/demo"
	)
	gen := copyTree(t, "testdata/kustomize/startup-taint")
	above := t.TempDir()
	rel, err := filepath.Rel(above, gen)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(above, "kustomization.yaml"), []byte("resources:\n- "+rel+"\nnamePrefix: x-\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, variant := range []struct {
		name, dir, namespace, user, policy string
	}{
		{"as rendered", gen, "prefetch", "system:serviceaccount:prefetch:image-prefetcher-demo", "image-prefetcher.prefetch.demo"},
		{"renamed above the function", above, "prefetch", "system:serviceaccount:prefetch:x-image-prefetcher-demo", "x-image-prefetcher.prefetch.demo"},
	} {
		t.Run(variant.name, func(t *testing.T) {
			manifests := kustomizeBuild(t, variant.dir)
			c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			admin, err := c.Clientset()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: variant.namespace}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
				t.Fatalf("apply rendered output: %v", err)
			}
			own := corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule}
			ownExec := corev1.Taint{Key: taintKey, Value: "x", Effect: corev1.TaintEffectNoExecute}
			other := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
			start := []corev1.Taint{own, ownExec, other}
			for _, name := range []string{"node-a", "node-b"} {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "x"}}, Spec: corev1.NodeSpec{Taints: start}}
				if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			cfg, err := c.RESTConfig()
			if err != nil {
				t.Fatal(err)
			}
			agent := impersonate(t, cfg, variant.user, "node-a")
			waitForPolicy(ctx, t, agent, "node-b")

			// taints is the JSON patch the agent sends: the list it read,
			// tested, and the list it wants.
			taints := func(want ...corev1.Taint) (types.PatchType, string) {
				old, _ := json.Marshal(start)
				if want == nil {
					return types.JSONPatchType, fmt.Sprintf(`[{"op":"test","path":"/spec/taints","value":%s},{"op":"remove","path":"/spec/taints"}]`, old)
				}
				nw, _ := json.Marshal(want)
				return types.JSONPatchType, fmt.Sprintf(`[{"op":"test","path":"/spec/taints","value":%s},{"op":"replace","path":"/spec/taints","value":%s}]`, old, nw)
			}
			merge := func(s string) (types.PatchType, string) { return types.MergePatchType, s }
			type patch func() (types.PatchType, string)
			cases := []struct {
				name    string
				node    string
				patch   patch
				allowed bool
			}{
				{"remove every taint with its key", "node-a", func() (types.PatchType, string) { return taints(other) }, true},
				{"remove one taint with its key", "node-a", func() (types.PatchType, string) { return taints(ownExec, other) }, true},
				{"remove its taints and write its label", "node-a", func() (types.PatchType, string) {
					// The key is written as the agent writes it: with an
					// annotation naming its own namespace as the owner.
					owner := fmt.Sprintf(`{"owner":{"namespace":%q,"name":"demo","daemonSet":"image-prefetcher-demo","id":"x"},"total":1,"present":1,"failed":[]}`, variant.namespace)
					return merge(fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"},"annotations":{%q:%q}},"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]}}`, labelKey, labelKey, owner))
				}, true},
				{"remove another taint", "node-a", func() (types.PatchType, string) { return taints(own, ownExec) }, false},
				{"remove every taint", "node-a", func() (types.PatchType, string) { return taints() }, false},
				{"add a taint", "node-a", func() (types.PatchType, string) {
					return taints(own, ownExec, other, corev1.Taint{Key: "new", Effect: corev1.TaintEffectNoSchedule})
				}, false},
				{"add a taint with its key", "node-a", func() (types.PatchType, string) {
					return taints(own, ownExec, other, corev1.Taint{Key: taintKey, Value: "again", Effect: corev1.TaintEffectPreferNoSchedule})
				}, false},
				{"change the effect of its taint", "node-a", func() (types.PatchType, string) {
					return taints(corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectPreferNoSchedule}, ownExec, other)
				}, false},
				{"swap its taint for another", "node-a", func() (types.PatchType, string) {
					return taints(ownExec, other, corev1.Taint{Key: "new", Effect: corev1.TaintEffectNoSchedule})
				}, false},
				{"remove its taint on another node", "node-b", func() (types.PatchType, string) { return taints(other) }, false},
				{"set spec.unschedulable", "node-a", func() (types.PatchType, string) { return merge(`{"spec":{"unschedulable":true}}`) }, false},
				{"remove its taint and set spec.unschedulable", "node-a", func() (types.PatchType, string) {
					return merge(`{"spec":{"unschedulable":true,"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]}}`)
				}, false},
				{"set spec.providerID", "node-a", func() (types.PatchType, string) { return merge(`{"spec":{"providerID":"x://y"}}`) }, false},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					// Every case starts from the same taints and a schedulable node.
					for _, n := range []string{"node-a", "node-b"} {
						b, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": start, "unschedulable": nil, "providerID": nil}})
						if _, err := admin.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
							t.Fatal(err)
						}
					}
					pt, body := tc.patch()
					_, err := agent.CoreV1().Nodes().Patch(ctx, tc.node, pt, []byte(body), metav1.PatchOptions{})
					switch {
					case tc.allowed && err != nil:
						t.Errorf("denied: %v", err)
					case !tc.allowed && err == nil:
						t.Errorf("allowed")
					case !tc.allowed && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+variant.policy+"'"):
						t.Errorf("denied, but not by the policy %s: %v", variant.policy, err)
					}
				})
			}
			t.Run("cluster admin is not restricted", func(t *testing.T) {
				if _, err := admin.CoreV1().Nodes().Patch(ctx, "node-b", types.MergePatchType, []byte(`{"spec":{"unschedulable":true,"taints":null}}`), metav1.PatchOptions{}); err != nil {
					t.Errorf("denied: %v", err)
				}
			})
		})
	}
}
