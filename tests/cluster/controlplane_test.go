package cluster_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// The control-plane-only mode serves real API semantics: a server-side
// dry run validates without storing, and Leases are stored.
func TestControlPlaneOnly(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dry", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "dry", metav1.GetOptions{}); err == nil {
		t.Fatal("dry-run create stored the ConfigMap")
	}
	bad := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "Not_A_Name", Namespace: "default"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
		t.Fatal("dry-run create accepted an invalid name")
	}

	holder := "a"
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "slot-0", Namespace: "default"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	if _, err := cs.CoordinationV1().Leases("default").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	got, err := cs.CoordinationV1().Leases("default").Get(ctx, "slot-0", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if got.Spec.HolderIdentity == nil || *got.Spec.HolderIdentity != holder {
		t.Fatalf("lease holder = %v, want %q", got.Spec.HolderIdentity, holder)
	}

	manifests := []byte(`apiVersion: v1
kind: Namespace
metadata:
  name: applied
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: applied
  namespace: applied
data:
  k: v
`)
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{DryRun: true}); err == nil {
		// The ConfigMap's namespace does not exist in a dry run.
		t.Fatal("dry-run apply into a namespace that does not exist succeeded")
	}
	objs, err := c.Apply(ctx, manifests, cluster.ApplyOptions{})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if len(objs) != 2 || objs[1].GetKind() != "ConfigMap" || objs[1].GetNamespace() != "applied" {
		t.Fatalf("applied %v", objs)
	}
	if _, err := cs.CoreV1().ConfigMaps("applied").Get(ctx, "applied", metav1.GetOptions{}); err != nil {
		t.Fatalf("applied ConfigMap not stored: %v", err)
	}

	out, err := c.Command(ctx, "sh", "-c", "ip -4 -o addr show veth0 && test -s \"$KUBECONFIG\"").CombinedOutput()
	if err != nil {
		t.Fatalf("command in namespace: %v: %s", err, out)
	}

	if out, err := c.Command(ctx, "kubectl", "get", "--raw", "/readyz").CombinedOutput(); err != nil || string(out) != "ok" {
		t.Fatalf("kubectl inside the namespace: %v: %s", err, out)
	}

	// An apiserver outage: requests fail, then everything is back.
	if err := c.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoordinationV1().Leases("default").Get(ctx, "slot-0", metav1.GetOptions{}); err == nil {
		t.Fatal("request succeeded with the apiserver stopped")
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoordinationV1().Leases("default").Get(ctx, "slot-0", metav1.GetOptions{}); err != nil {
		t.Fatalf("lease after apiserver restart: %v", err)
	}
}
