package runtimes_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

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

		if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "succeeded", "")); err != nil {
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
		if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "failed", "Removed")); err != nil {
			t.Fatalf("removal not noticed: %v\n%s", err, logs)
		}
		if d := time.Since(removed); d > removalBound {
			t.Errorf("labeled Removed %s after the removal, want within %s", d.Round(100*time.Millisecond), removalBound)
		} else {
			t.Logf("%s: labeled Removed %s after the removal", n.rt, d.Round(100*time.Millisecond))
		}
		if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "succeeded", "")); err != nil {
			t.Fatalf("not repaired: %v\n%s", err, logs)
		}
		if ok, err := n.node.HasImage(ctx, ref); !ok || err != nil {
			t.Errorf("the label is succeeded again, but the image is not there (%v)", err)
		}

		if n.rt == cluster.CRIO {
			return
		}
		if err := c.RestartRuntimes(ctx, []*cluster.Node{n.node}, true); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "failed", "Removed")); err != nil {
			t.Fatalf("wipe not noticed: %v\n%s", err, logs)
		}
		if d := time.Since(back); d > removalBound {
			t.Errorf("labeled Removed %s after the wiped runtime returned, want within %s", d.Round(100*time.Millisecond), removalBound)
		} else {
			t.Logf("%s: labeled Removed %s after the wiped runtime returned", n.rt, d.Round(100*time.Millisecond))
		}
		if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "succeeded", "")); err != nil {
			t.Fatalf("not repaired after the wipe: %v\n%s", err, logs)
		}
	})
}

// startWatch runs `image-prefetcher watch` for images on n through socket
// until the test ends, and returns the file of its log.
func startWatch(ctx context.Context, t *testing.T, n *node, socket, instance string, images ...string) logFile {
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
	logs := logFile(filepath.Join(t.TempDir(), "watch.log"))
	f, err := os.Create(string(logs))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = cmd.Wait()
	})
	return logs
}

// logFile is a process's log, read when a test fails.
type logFile string

func (l logFile) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
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
