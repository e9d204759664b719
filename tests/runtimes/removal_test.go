package runtimes_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// removalBound is how soon a removed image must turn the label failed
// (issue #25).
const removalBound = 15 * time.Second

// idleWindow is how long the removal watch's cost is counted while
// nothing happens.
const idleWindow = 30 * time.Second

// TestRemovalNoticed runs `watch` on each runtime through a proxy that
// counts its calls, with a refresh interval of 10 minutes, so that only
// the removal watch can notice anything within the test:
//
//   - idle for 30 s once the label is succeeded, the agent makes at most 6
//     runtime calls a minute (0 on containerd, whose event stream it
//     follows; one ListImages per 10 s on CRI-O);
//   - the image is removed with the runtime's tool (`ctr images rm` on
//     containerd; on CRI-O the CRI RemoveImage that `crictl rmi` and the
//     kubelet's image GC send): the label is failed, reason Removed,
//     within 15 s, and succeeded again once watch has pulled it back;
//   - on containerd, the runtime is stopped, its root wiped and started
//     again: Removed within 15 s of its return, then repaired.
func TestRemovalNoticed(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, n *node) {
		createNode(t, n)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		pushData(ctx, t, n.repo("removal")+":v1", 60)
		ref := n.ref("removal", "v1")
		fresh(ctx, t, n, ref)
		proxy := startCRIProxy(t, n.node.CRISocket)
		const instance = "removal"
		key := labelDomain + instance
		logs := startWatch(ctx, t, n, proxy.Socket, instance, ref)

		if _, err := c.WaitNode(ctx, n.node.Name, labelIs(key, "succeeded", "")); err != nil {
			t.Fatalf("first check: %v\n%s", err, logs)
		}
		before := proxy.Calls()
		idle := time.NewTimer(idleWindow)
		<-idle.C
		calls, total := since(before, proxy.Calls())
		perMinute := float64(total) * float64(time.Minute) / float64(idleWindow)
		t.Logf("%s: %d runtime calls in %s idle (%.1f a minute): %v", n.rt, total, idleWindow, perMinute, calls)
		if perMinute > 6 {
			t.Errorf("the removal watch made %.1f runtime calls a minute, above the budget of 6: %v", perMinute, calls)
		}

		removeImage(ctx, t, n, ref)
		removed := time.Now()
		if _, err := c.WaitNode(ctx, n.node.Name, labelIs(key, "failed", "Removed")); err != nil {
			t.Fatalf("removal not noticed: %v\n%s", err, logs)
		}
		if d := time.Since(removed); d > removalBound {
			t.Errorf("labeled Removed %s after the removal, want within %s", d.Round(100*time.Millisecond), removalBound)
		} else {
			t.Logf("%s: labeled Removed %s after the removal", n.rt, d.Round(100*time.Millisecond))
		}
		if _, err := c.WaitNode(ctx, n.node.Name, labelIs(key, "succeeded", "")); err != nil {
			t.Fatalf("not repaired: %v\n%s", err, logs)
		}
		if !present(ctx, t, n, ref) {
			t.Error("the label is succeeded again, but the image is not there")
		}

		if n.rt == cluster.CRIO {
			return
		}
		if err := c.RestartRuntimes(ctx, []*cluster.Node{n.node}, true); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		if _, err := c.WaitNode(ctx, n.node.Name, labelIs(key, "failed", "Removed")); err != nil {
			t.Fatalf("wipe not noticed: %v\n%s", err, logs)
		}
		if d := time.Since(back); d > removalBound {
			t.Errorf("labeled Removed %s after the wiped runtime returned, want within %s", d.Round(100*time.Millisecond), removalBound)
		} else {
			t.Logf("%s: labeled Removed %s after the wiped runtime returned", n.rt, d.Round(100*time.Millisecond))
		}
		if _, err := c.WaitNode(ctx, n.node.Name, labelIs(key, "succeeded", "")); err != nil {
			t.Fatalf("not repaired after the wipe: %v\n%s", err, logs)
		}
	})
}

// labelIs holds when key's label is value and, unless reason is empty,
// some image of its annotation failed with reason.
func labelIs(key, value, reason string) func(*corev1.Node) bool {
	return func(node *corev1.Node) bool {
		if node.Labels[key] != value {
			return false
		}
		if reason == "" {
			return true
		}
		s, err := label.Parse(node.Annotations[key])
		if err != nil {
			return false
		}
		for _, f := range s.Failed {
			if f.Reason == reason {
				return true
			}
		}
		return false
	}
}

// startWatch runs `image-prefetcher watch` for images on n through socket
// until the test ends, and returns its log.
func startWatch(ctx context.Context, t *testing.T, n *node, socket, instance string, images ...string) *syncBuffer {
	t.Helper()
	list := filepath.Join(t.TempDir(), "images.txt")
	var b bytes.Buffer
	for _, img := range images {
		b.WriteString(img + "\n")
	}
	if err := os.WriteFile(list, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	cmd := c.Command(wctx, agentBin(), "watch",
		"--kubeconfig="+c.Kubeconfig,
		"--cri-socket="+socket,
		"--node-name="+n.node.Name,
		"--instance="+instance,
		"--namespace=image-prefetcher-runtimes",
		"--image-list-file="+list,
		"--refresh-interval=10m",
		"--log-format=json")
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = cmd.Wait()
	})
	return logs
}

// syncBuffer is a log written by a process and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// removeImage removes ref with the runtime's own tool.
func removeImage(ctx context.Context, t *testing.T, n *node, ref string) {
	t.Helper()
	if n.rt == cluster.CRIO {
		cri, err := n.node.CRI()
		if err != nil {
			t.Fatal(err)
		}
		defer cri.Close()
		if _, err := cri.Images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("remove %s: %v", ref, err)
		}
		return
	}
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.node.CRISocket, "-n", "k8s.io", "images", "rm", ref).CombinedOutput(); err != nil {
		t.Fatalf("ctr images rm %s: %v\n%s", ref, err, out)
	}
}

// present reports whether the runtime has ref.
func present(ctx context.Context, t *testing.T, n *node, ref string) bool {
	t.Helper()
	cri, err := n.node.CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	resp, err := cri.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetImage() != nil
}
