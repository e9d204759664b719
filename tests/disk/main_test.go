// Package disk_test runs the agent, rendered by the function, on a real
// kubelet whose node has a small image filesystem of its own (a 128 MiB
// tmpfs at containerd's root) and the kubelet's production thresholds:
// image GC from 85% down to 80%, and eviction below 15% imagefs available
// (DiskPressure). A list that cannot fit labels the node failed with
// InsufficientDisk within 30 s, the filesystem never reaches the disk
// ceiling, and the node never gets DiskPressure; an image removed under a
// running agent is labeled Removed at once and pulled again under herd
// control.
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/disk/ (after `make
// build tools host-deps kube`).
package disk_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

const labelDomain = "image-prefetcher.stackrox.io/"

// storeBytes is the node's image filesystem.
const storeBytes = 128 << 20

var c *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, cluster.Options{
		Deploys:         true,
		Nodes:           1,
		ImageStoreBytes: storeBytes,
		// CA-signed kubelets with webhook authorization, as kubeadm with
		// serverTLSBootstrap: TestLateKubeletFigures reads their stats.
		KubeletAuth: true,
		// The kubelet's defaults, in place of the harness's 1% thresholds
		// and GC at 100/99.
		KubeletConfig: map[string]any{
			"evictionHard": map[string]string{
				"memory.available":   "100Mi",
				"nodefs.available":   "10%",
				"nodefs.inodesFree":  "5%",
				"imagefs.available":  "15%",
				"imagefs.inodesFree": "5%",
			},
			"imageGCHighThresholdPercent": 85,
			"imageGCLowThresholdPercent":  80,
		},
	}, &c))
}

// labeled holds when instance's label is value and, unless reason is
// empty, an image of its annotation failed with reason.
func labeled(instance, value, reason string) func(*corev1.Node) bool {
	return cluster.LabelIs(labelDomain+instance, value, reason)
}

// waitNode waits for cond on the node, at most timeout, and returns it.
func waitNode(t *testing.T, what string, timeout time.Duration, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	n, err := c.WaitNode(ctx, c.Nodes()[0].Name, cond)
	if err != nil {
		c.DumpLogs(t)
		t.Fatalf("%s: %v", what, err)
	}
	return n
}

// summary is instance's annotation on n.
func summary(t *testing.T, n *corev1.Node, instance string) label.Summary {
	t.Helper()
	s, err := label.Parse(n.Annotations[labelDomain+instance])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fetchStarted is when the fetch container of instance's pod started.
func fetchStarted(t *testing.T, instance string) time.Time {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods(instance).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, st := range p.Status.InitContainerStatuses {
			if st.Name != "fetch" {
				continue
			}
			if r := st.State.Running; r != nil {
				return r.StartedAt.Time
			}
			if d := st.State.Terminated; d != nil {
				return d.StartedAt.Time
			}
		}
	}
	t.Fatalf("no started fetch container in %s", instance)
	return time.Time{}
}
