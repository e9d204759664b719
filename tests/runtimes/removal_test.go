package runtimes_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
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
//     runtime calls a minute (on containerd, whose event stream it
//     follows, only the look 2 s after subscribing; one ListImages per
//     10 s on CRI-O);
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
		repaired(ctx, t, n, key, ref, logs)

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
	// Stopped as the kubelet stops it: watch then removes its label, and
	// the test run again (-count) starts without it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
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
		if err := n.node.Remove(ctx, ref); err != nil {
			t.Fatal(err)
		}
		return
	}
	ctr(ctx, t, n, "images", "rm", ref)
}

// subscribeMethod is containerd's event stream, which the agent follows
// for image deletions.
const subscribeMethod = "/containerd.services.events.v1.Events/Subscribe"

// TestRemovalDuringCheck (issue 38, finding 1): an image of the list,
// present when watch starts, is removed while watch's first check is
// still pulling another image, held at the registry. On containerd the
// held pull goes on only once the image's delete event has reached the
// agent, so the event comes before the check hands over the set of
// images it found present. The removal must not be lost: the label is
// failed, reason Removed, within 15 s of it, then succeeded again once
// the image is pulled back. (The agent used to drop the event, as the
// image was not yet watched, and the label said succeeded until the next
// refresh, 10 minutes later.)
func TestRemovalDuringCheck(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, n *node) {
		createNode(t, n)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		pushData(ctx, t, n.repo("during-a")+":v1", 61)
		slow := pushData(ctx, t, n.repo("during-b")+":v1", 62)
		a, b := n.ref("during-a", "v1"), n.ref("during-b", "v1")
		fresh(ctx, t, n, b)
		if err := n.node.Pull(ctx, a); err != nil {
			t.Fatal(err)
		}
		held := registry.Match{Repo: n.repo("during-b"), Ref: firstLayer(t, slow)}
		heldBefore := c.Registry().Stalled(held)
		release := c.Registry().Hold(held, 1)
		defer release()
		proxy := startCRIProxy(t, n.node.CRISocket)
		const instance = "removal-during-check"
		key := labelDomain + instance
		logs := startWatch(ctx, t, n, proxy.Socket, instance, a, b)

		waitUntil(ctx, t, "the check to pull "+b, func() bool { return c.Registry().Stalled(held) > heldBefore })
		events := 0
		if n.rt != cluster.CRIO {
			events = eventsReachAgent(ctx, t, n, proxy, a)
		}
		labeled := watchNode(ctx, t, n, removalBound+10*time.Second, cluster.LabelIs(key, "failed", "Removed"))
		removeImage(ctx, t, n, a)
		removed := time.Now()
		if n.rt != cluster.CRIO {
			waitUntil(ctx, t, "the delete event to reach the agent", func() bool { return proxy.Sent(subscribeMethod) > events })
		}
		release()
		noticed(ctx, t, n, key, labeled, removed, logs)
		repaired(ctx, t, n, key, a, logs)
		t.Logf("%s: took %s", n.rt, time.Since(start).Round(100*time.Millisecond))
	})
}

// TestTagAndDigestRecordRemoved (issue 38, finding 3): a list entry
// written repo:tag@sha256:... is recorded by containerd as
// repo@sha256:... only, beside its ID. Once the label is succeeded, that
// record is deleted (`ctr images rm`): the kubelet's ImageStatus for the
// entry finds nothing, and the label must be failed, reason Removed,
// within 15 s, then succeeded again once the image is pulled back. On
// CRI-O the image is removed by the CRI, as the kubelet's image GC does.
// (The agent used to compare the deleted name with the entry, tag
// included, and the label stayed succeeded.)
func TestTagAndDigestRecordRemoved(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, n *node) {
		createNode(t, n)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		repo := n.repo("tag-digest")
		img := pushData(ctx, t, repo+":v1", 63)
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ref := n.ref("tag-digest", "v1") + "@" + d.String()
		fresh(ctx, t, n, ref)
		const instance = "removal-tag-digest"
		key := labelDomain + instance
		// On containerd, through a proxy that counts the events reaching
		// the agent: a deletion before containerd has registered the
		// agent's subscription has no event (the look 2 s after subscribing
		// finds it, and this test is about the event), so the removal
		// waits until a probe's deletion has reached it.
		socket, record := n.node.CRISocket, cluster.RegistryAddr+"/"+repo+"@"+d.String()
		var proxy *criProxy
		if n.rt != cluster.CRIO {
			proxy = startCRIProxy(t, socket)
			socket = proxy.Socket
		}
		logs := startWatch(ctx, t, n, socket, instance, ref)
		if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "succeeded", "")); err != nil {
			t.Fatalf("first check: %v\n%s", err, logs)
		}

		labeled := watchNode(ctx, t, n, removalBound+10*time.Second, cluster.LabelIs(key, "failed", "Removed"))
		if n.rt == cluster.CRIO {
			removeImage(ctx, t, n, ref)
		} else {
			var records []string
			for _, name := range strings.Fields(ctr(ctx, t, n, "images", "ls", "-q")) {
				if strings.Contains(name, "/"+repo) {
					records = append(records, name)
				}
			}
			if len(records) != 1 || records[0] != record {
				t.Fatalf("containerd records %s as %v, want only %s", ref, records, record)
			}
			eventsReachAgent(ctx, t, n, proxy, record)
			ctr(ctx, t, n, "images", "rm", record)
		}
		removed := time.Now()
		// containerd's CRI plugin forgets the record when it handles the
		// delete event, a moment after `ctr images rm` returns.
		waitUntil(ctx, t, "the kubelet's ImageStatus for "+ref+" to find nothing", func() bool {
			ok, err := n.node.HasImage(ctx, ref)
			return err == nil && !ok
		})
		noticed(ctx, t, n, key, labeled, removed, logs)
		repaired(ctx, t, n, key, ref, logs)
		t.Logf("%s: took %s", n.rt, time.Since(start).Round(100*time.Millisecond))
	})
}

// watchNode starts watching n's Node until cond holds for it, for at most
// within, and returns once the watch has read the Node: every change
// after that is seen. The channel gets when cond held, or the zero time
// when it did not within the time.
func watchNode(ctx context.Context, t *testing.T, n *node, within time.Duration, cond func(*corev1.Node) bool) <-chan time.Time {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, within)
	read := make(chan struct{})
	var once sync.Once
	held := make(chan time.Time, 1)
	go func() {
		defer cancel()
		_, err := c.WaitNode(wctx, n.node.Name, func(node *corev1.Node) bool {
			once.Do(func() { close(read) })
			return cond(node)
		})
		once.Do(func() { close(read) })
		if err != nil {
			held <- time.Time{}
			return
		}
		held <- time.Now()
	}()
	<-read
	return held
}

// noticed checks that the label watched by labeled turned Removed within
// removalBound of removed.
func noticed(ctx context.Context, t *testing.T, n *node, key string, labeled <-chan time.Time, removed time.Time, logs logFile) {
	t.Helper()
	at := <-labeled
	if at.IsZero() {
		node, err := c.WaitNode(ctx, n.node.Name, func(*corev1.Node) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		t.Fatalf("the removal was lost: %s after it, the label is %q (annotation %s)\n%s",
			time.Since(removed).Round(100*time.Millisecond), node.Labels[key], node.Annotations[key], logs)
	}
	if d := at.Sub(removed); d > removalBound {
		t.Errorf("labeled Removed %s after the removal, want within %s", d.Round(100*time.Millisecond), removalBound)
	} else {
		t.Logf("%s: labeled Removed %s after the removal", n.rt, d.Round(100*time.Millisecond))
	}
}

// repaired waits for the label to say succeeded again, with ref back on
// the node.
func repaired(ctx context.Context, t *testing.T, n *node, key, ref string, logs logFile) {
	t.Helper()
	if _, err := c.WaitNode(ctx, n.node.Name, cluster.LabelIs(key, "succeeded", "")); err != nil {
		t.Fatalf("not repaired: %v\n%s", err, logs)
	}
	if ok, err := n.node.HasImage(ctx, ref); !ok || err != nil {
		t.Errorf("the label is succeeded again, but %s is not there (%v)", ref, err)
	}
}

// eventsReachAgent makes sure the agent's subscription to containerd's
// events is live before a test relies on it: it tags ref under a probe
// name and deletes that record until a delete event reaches the agent
// through proxy. It returns how many events have.
func eventsReachAgent(ctx context.Context, t *testing.T, n *node, proxy *criProxy, ref string) int {
	t.Helper()
	probe := cluster.RegistryAddr + "/" + n.repo("probe") + ":v1"
	deadline := time.Now().Add(30 * time.Second)
	for proxy.Sent(subscribeMethod) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no image delete event reached the agent within 30 s")
		}
		ctr(ctx, t, n, "images", "tag", "--force", ref, probe)
		ctr(ctx, t, n, "images", "rm", probe)
		for i := 0; i < 20 && proxy.Sent(subscribeMethod) == 0; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return proxy.Sent(subscribeMethod)
}

// waitUntil polls cond until it holds, for at most 30 s.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited 30 s for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ctr runs containerd's ctr on n's socket, in the CRI's namespace, and
// returns its output.
func ctr(ctx context.Context, t *testing.T, n *node, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.node.CRISocket, "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
