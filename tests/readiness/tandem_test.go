package readiness_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// TestStartupTaintsOfTwoInstances: two instances rendered in one
// ResourceList, each with narrowed tolerations and a startup taint of its
// own, and a node that carries both taints. The function gives each
// DaemonSet a toleration for the other's key, so both agents start there
// and both taints go; with only its own key each agent would wait for the
// other's taint for ever.
func TestStartupTaintsOfTwoInstances(t *testing.T) {
	setup(t)
	img := pushData(t, 1706, "tandem", 64<<10)
	n1 := c.Nodes()[0]
	keys := []string{"example.com/tandem-a", "example.com/tandem-b"}
	setTaints(t, n1.Name, corev1.Taint{Key: keys[0], Effect: corev1.TaintEffectNoSchedule}, corev1.Taint{Key: keys[1], Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() { setTaints(t, n1.Name) })

	files := map[string]string{
		"kustomization.yaml": "resources:\n- tandem-a.yaml\n- tandem-b.yaml\ntransformers:\n- fn.yaml\n",
		"fn.yaml":            fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: image-prefetcher-fn\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: %s\n", cluster.BinPath("image-prefetcher-fn")),
	}
	var ins []*instance
	for i, name := range []string{"tandem-a", "tandem-b"} {
		files[name+".yaml"] = fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels:
    pod-security.kubernetes.io/enforce: privileged
---
apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: %[1]s
  namespace: %[1]s
spec:
  agent:
    image: %[2]s
  images:
  - %[3]s
  nodeSelector:
    e2e.image-prefetcher.io/node: %[4]s
  tolerations:
  - key: example.com/dedicated
    operator: Exists
  startupTaint:
    key: %[5]s
`, name, agentRef, img, n1.Name, keys[i])
		ins = append(ins, &instance{name: name})
	}
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	manifests, err := cluster.Kustomize(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		in.manifests = manifests
		t.Cleanup(func() { remove(t, in) })
	}
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, "both startup taints removed from "+n1.Name, func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, n1.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return !cluster.HasTaint(n, keys[0]) && !cluster.HasTaint(n, keys[1]), fmt.Sprintf("taints %v", n.Spec.Taints)
	}); err != nil {
		dumpPods(t, ins[0].name)
		dumpPods(t, ins[1].name)
		t.Fatal(err)
	}
	for _, in := range ins {
		waitLabel(t, in, n1.Name, "succeeded", time.Minute)
	}
}
