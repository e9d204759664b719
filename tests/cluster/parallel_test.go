package cluster_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// Two runs on one machine must never collide: CI, a developer's `make demo`
// and `make bench` can overlap. Both clusters start at the same moment, so
// any shared name (socket, cgroup, veth, port, directory) shows up as a
// failed start or as one cluster seeing the other's objects.
func TestTwoClustersSideBySide(t *testing.T) {
	var (
		wg       sync.WaitGroup
		clusters [2]*cluster.Cluster
		errs     [2]error
	)
	for i := range clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			clusters[i], errs[i] = cluster.Start(ctx, cluster.Options{Nodes: 1})
		}()
	}
	wg.Wait()
	stopped := [2]bool{}
	stop := func(i int) {
		if clusters[i] == nil || stopped[i] {
			return
		}
		stopped[i] = true
		if err := clusters[i].Stop(context.Background()); err != nil {
			t.Errorf("stop cluster %d: %v", i, err)
		}
		if left := clusters[i].Leftovers(); len(left) > 0 {
			t.Errorf("cluster %d's teardown left behind:\n  %s", i, strings.Join(left, "\n  "))
		}
	}
	t.Cleanup(func() {
		for i := range clusters {
			if t.Failed() && clusters[i] != nil {
				clusters[i].DumpLogs(t)
			}
			stop(i)
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start cluster %d: %v", i, err)
		}
	}
	a, b := clusters[0], clusters[1]
	if a.Dir == b.Dir || a.NetNS.Path == b.NetNS.Path {
		t.Fatalf("the runs share a directory or network namespace: %s, %s", a.Dir, b.Dir)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	csA, err := a.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	csB, err := b.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range clusters {
		cs, err := c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("cluster %d: list nodes: %v", i, err)
		}
		if len(nodes.Items) != 1 || !nodeReady(nodes.Items[0]) {
			t.Fatalf("cluster %d: want its one node, Ready; got %d nodes", i, len(nodes.Items))
		}
	}

	// Each apiserver has its own etcd: an object in one is absent in the other.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "only-in-a", Namespace: "default"}}
	if _, err := csA.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create in cluster 0: %v", err)
	}
	if _, err := csB.CoreV1().ConfigMaps("default").Get(ctx, "only-in-a", metav1.GetOptions{}); err == nil {
		t.Fatal("cluster 1 sees cluster 0's ConfigMap: the runs share a store")
	}

	// Tearing one down must leave the other whole: nothing it stops or
	// restores (processes, mounts, cgroups, sysctls) belongs to the other.
	stop(0)
	if t.Failed() {
		t.FailNow()
	}
	if out, err := b.Command(ctx, "kubectl", "get", "--raw", "/readyz").CombinedOutput(); err != nil || string(out) != "ok" {
		t.Fatalf("cluster 1 after cluster 0's teardown: %v: %s", err, out)
	}
	// The kubelet keeps renewing its Lease only if its containerd, cgroup
	// and network survived the other teardown; wait for a renewal that
	// happened after it.
	after := time.Now()
	for {
		l, err := csB.CoordinationV1().Leases("kube-node-lease").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("cluster 1: list node leases: %v", err)
		}
		if len(l.Items) == 1 && l.Items[0].Spec.RenewTime != nil && l.Items[0].Spec.RenewTime.After(after) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("cluster 1's kubelet stopped renewing its Lease after cluster 0's teardown")
		case <-time.After(time.Second):
		}
	}
	nodes, err := csB.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 || !nodeReady(nodes.Items[0]) {
		t.Fatalf("cluster 1's node after cluster 0's teardown: %v", err)
	}
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
