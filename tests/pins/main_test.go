// Package pins_test runs the agent's pinning on a real kubelet with a
// containerd 2.x node and image GC switched on: the prefetched images
// survive a GC pass that removed an unlisted image, and the pins follow
// the list and the instance's lifetime. On Debian's containerd 1.6.20,
// which cannot pin, the same GC collects them (unpinnable_test.go).
//
// The kubelet's periodic image GC runs every 5 minutes, which is not a
// setting. Its eviction manager looks every 10 s, and under image
// filesystem pressure deletes every unused, unpinned image older than
// imageMinimumGCAge at once (DeleteUnusedImages). So the node gets a small
// image filesystem of its own (a 192 MiB tmpfs), evictionHard
// imagefs.available<45%, and imageMinimumGCAge 1s; pulling a 48 MiB image
// nobody uses crosses the threshold, and the next passes remove it. The
// node's containerd root is the harness's directory, not
// /var/lib/containerd (as on k3s).
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/pins/ (after `make
// build tools host-deps kube runtimes`).
package pins_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

const labelDomain = "image-prefetcher.stackrox.io/"

var c *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, gcOptions(cluster.Containerd2), &c))
}

// gcOptions is one node of rt whose kubelet's image GC runs within a
// test's time.
func gcOptions(rt cluster.Runtime) cluster.Options {
	// The kubelet serves a self-signed certificate, as kubeadm's and kind's
	// do: the agent reads the image filesystem's figures from its own root
	// filesystem (docs/agent.md, "Node figures").
	return cluster.ImageGCOptions(rt, "1m")
}

// uninstall deletes the instance's DaemonSet, as deleting the rendered
// objects does, and waits until its pod is gone: watch has then run its
// exit.
func uninstall(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	waitWatching(ctx, t, name)
	c.Uninstall(ctx, t, name)
}

// waitWatching waits until watch runs in every pod of namespace ns and has
// said it is watching, and logs their last words when the test fails.
func waitWatching(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	// Removing pins is watch's: wait until it runs (a pod deleted before
	// its watch started leaves its label and pins, see docs/agent.md).
	var pods *corev1.PodList
	if err := cluster.Poll(ctx, 250*time.Millisecond, "watch running in every pod of "+name, func() (bool, string) {
		pods, err = cs.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			running := false
			for _, st := range p.Status.ContainerStatuses {
				running = running || st.Name == "watch" && st.State.Running != nil
			}
			if !running || p.DeletionTimestamp != nil {
				return false, p.Name + " " + string(p.Status.Phase)
			}
		}
		return len(pods.Items) > 0, "no pods"
	}); err != nil {
		t.Fatal(err)
	}
	// The agent's last words, for when the pins it should remove stay;
	// and running is not enough: watch must have said it is watching.
	for _, p := range pods.Items {
		w, err := c.FollowLog(ctx, name, p.Name, "watch")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			w.Ended()
			if t.Failed() {
				t.Logf("log of %s/%s, watch:\n%s", name, p.Name, w)
			}
		})
		if err := w.Watching(ctx); err != nil {
			t.Fatalf("%s/%s: %v", name, p.Name, err)
		}
	}
}

// waitSummary waits until the node's label of instance is want and its
// annotation satisfies ok, and returns the annotation.
func waitSummary(t *testing.T, instance, want string, timeout time.Duration, ok func(label.Summary) bool) label.Summary {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	key := labelDomain + instance
	var s label.Summary
	err = cluster.Poll(ctx, 250*time.Millisecond, instance+" labeled "+want, func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, c.Nodes()[0].Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if n.Labels[key] != want {
			return false, n.Labels[key] + " " + n.Annotations[key]
		}
		if s, err = label.Parse(n.Annotations[key]); err != nil {
			return false, err.Error()
		}
		return ok == nil || ok(s), n.Annotations[key]
	})
	if err != nil {
		c.DumpLogs(t)
		t.Fatal(err)
	}
	return s
}

func list(refs ...string) string {
	return "  images:\n  - " + strings.Join(refs, "\n  - ") + "\n"
}

// runtime is the node's containerd: its CRI, and its image records
// through the same API the agent pins with.
type runtime struct{ n *cluster.Node }

func node(t *testing.T) *runtime { return &runtime{n: c.Nodes()[0]} }

// status is the CRI's word on ref: nil when absent.
func (r *runtime) status(t *testing.T, ref string) *runtimeapi.Image {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	img, err := r.n.Image(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// pinned asserts what the CRI reports, which is what the kubelet's GC
// reads.
func (r *runtime) pinned(t *testing.T, ref string, want bool) {
	t.Helper()
	img := r.status(t, ref)
	if img == nil {
		t.Errorf("%s is not on the node", ref)
		return
	}
	if img.GetPinned() != want {
		t.Errorf("%s: CRI pinned = %v, want %v", ref, img.GetPinned(), want)
	}
}

// labels returns the labels of the image record name.
func (r *runtime) labels(t *testing.T, name string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := r.n.ImageLabels(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// nodeLabels records every value the node's label key takes from now until
// stop is called.
func nodeLabels(t *testing.T, key string) (stop func() []string) {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Get(ctx, c.Nodes()[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	events, seen := 0, []string{n.Labels[key]}
	end, err := c.WatchNode(ctx, n.Name, n.ResourceVersion, func(o *corev1.Node) {
		mu.Lock()
		defer mu.Unlock()
		events++
		if v := o.Labels[key]; seen[len(seen)-1] != v {
			seen = append(seen, v)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() []string {
		if err := end(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the node changed %d times meanwhile", events)
		return seen
	}
}
