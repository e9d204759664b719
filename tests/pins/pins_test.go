package pins_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/cli"
	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// The prefetched images survive a GC pass that provably ran: the kubelet
// removes an unlisted image nobody uses in the same passes, and the label
// says succeeded throughout. A pod that then runs a prefetched image finds
// it on the node, and status --hits counts that hit. The agent runs at
// system-node-critical priority, which the eviction manager never evicts:
// its first pass under pressure only sees the unlisted image for the first
// time (too young for imageMinimumGCAge), and would evict any other pod.
//
// The function's default rendering (no spec.disk, no spec.pin): the pin
// budget is a share of the image filesystem, whose capacity the agent
// reads from its own root filesystem (the kubelet's certificate is
// self-signed, as on kubeadm: issue 48); nothing of the node is mounted.
// Two GC passes, each removing an unlisted image, leave the set pinned.
func TestPrefetchedImagesSurviveImageGC(t *testing.T) {
	rt := node(t)
	n := c.Nodes()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	refs := c.PushData(t, 900, 4<<20, "gc-a", "gc-b")
	// The pod after the GC pass runs this one.
	if err := c.PushPause(ctx, "e2e/gc-run:v1", "64000:64000"); err != nil {
		t.Fatal(err)
	}
	run := "ghcr.io/e2e/gc-run:v1"
	refs = append(refs, run)
	c.Deploy(t, "gc", list(refs...)+"  priorityClassName: system-node-critical\n")
	s := waitSummary(t, "gc", "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Pins != nil && s.Pins.Images == len(refs) })
	capacity, _, err := n.ImageStoreUsage()
	if err != nil {
		t.Fatal(err)
	}
	budget := capacity / 100 * 25
	if p := s.Pins; p.Bytes < 2*(4<<20) || p.BudgetBytes != budget || len(p.NotPinned) != 0 || p.Unsupported != "" || p.Error != "" {
		t.Errorf("pins %+v: want all %d images, at least their 8 MiB of layers, within the default budget of %d bytes (25%% of the %d-byte image filesystem)", p, len(refs), budget, capacity)
	}
	if d := s.Disk; d == nil || d.Unknown != "" || d.CapacityBytes != capacity || d.CeilingPercent != 80 {
		t.Errorf("annotation's disk %+v, want the node's %d-byte image filesystem and the ceiling of 80%%", d, capacity)
	}
	statusShowsBudget(ctx, t, "gc", budget)
	for _, r := range refs {
		rt.pinned(t, r, true)
	}

	labels := nodeLabels(t, labelDomain+"gc")
	var unlistedIDs []string
	var removedAt time.Time
	for i, name := range []string{"gc-unlisted", "gc-unlisted-2"} {
		unlisted := c.PushData(t, int64(950+i), 48<<20, name)[0]
		if _, err := c.WaitNode(ctx, n.Name, func(n *corev1.Node) bool { return !condition(n, corev1.NodeDiskPressure) }); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := n.Pull(ctx, unlisted); err != nil {
			t.Fatal(err)
		}
		unlistedIDs = append(unlistedIDs, rt.status(t, unlisted).GetId())
		if err := cluster.Poll(ctx, 500*time.Millisecond, "the kubelet's image GC to remove "+unlisted, func() (bool, string) {
			return rt.status(t, unlisted) == nil, "still there"
		}); err != nil {
			c.DumpLogs(t)
			t.Fatal(err)
		}
		removedAt = time.Now()
		t.Logf("the kubelet removed the unlisted image %s %.1fs after its pull", unlisted, removedAt.Sub(start).Seconds())
		for _, r := range refs {
			rt.pinned(t, r, true)
		}
	}

	// The kubelet's own account: each pass, and each image it removed.
	log, err := os.ReadFile(filepath.Join(c.Dir, "logs", n.Name+"-kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	passes, removed := 0, []string{}
	for _, l := range strings.Split(string(log), "\n") {
		switch {
		case strings.Contains(l, "Attempting to delete unused images"):
			passes++
		case strings.Contains(l, "Removing image to free bytes"):
			removed = append(removed, l)
		}
	}
	if len(removed) != 2 || !strings.Contains(removed[0], unlistedIDs[0]) || !strings.Contains(removed[1], unlistedIDs[1]) {
		t.Errorf("the kubelet removed %q, want only the unlisted images %s", removed, unlistedIDs)
	}
	if passes < 2 {
		t.Errorf("%d image GC passes, want at least 2", passes)
	}
	t.Logf("%d image GC passes under imagefs pressure; removed: %s", passes, unlistedIDs)

	// A pod that selects the label, as users schedule, once the kubelet
	// admits pods again (no DiskPressure).
	if _, err := c.WaitNode(ctx, n.Name, func(n *corev1.Node) bool { return !condition(n, corev1.NodeDiskPressure) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("DiskPressure cleared %.1fs after the removal", time.Since(removedAt).Seconds())
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, "gc-apps"); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "after-gc", Namespace: "gc-apps", Labels: map[string]string{"app": "after-gc"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{labelDomain + "gc": "succeeded"},
			Containers:   []corev1.Container{{Name: "app", Image: run, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	if _, err := cs.CoreV1().Pods("gc-apps").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPodsRunning(ctx, "gc-apps", "app=after-gc", 1); err != nil {
		t.Fatal(err)
	}
	if err := waitEvent(ctx, cs, "gc-apps", "after-gc", "Pulled"); err != nil {
		t.Fatal(err)
	}
	t.Logf("the pod's image was there %.1fs after the removal", time.Since(removedAt).Seconds())
	v := statusHits(ctx, t, c, "gc")
	if len(v.Nodes) != 1 || v.Nodes[0].Node != n.Name || v.Hits != 1 || v.Misses != 0 || v.NotCounted != 0 ||
		len(v.Nodes[0].Pulls) != 1 || v.Nodes[0].Pulls[0].Pod != "gc-apps/after-gc" || v.Nodes[0].Pulls[0].Image != run {
		t.Errorf("status --hits: %+v, want the one hit of gc-apps/after-gc on %s", v, n.Name)
	}
	if seen := labels(); strings.Join(seen, ",") != "succeeded" {
		t.Errorf("the label took the values %v from the unlisted pull to the hit, want succeeded throughout", seen)
	}
	// Its pins would take the node's budget from the tests after it.
	uninstall(t, "gc")
}

// statusShowsBudget asserts that status shows the budget the node's agent
// computed, in bytes (-o json) and in the table, and the disk's figures.
func statusShowsBudget(ctx context.Context, t *testing.T, instance string, budget uint64) {
	t.Helper()
	out, err := c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "-o", "json", "--kubeconfig", c.Kubeconfig, "--instance", instance).Output()
	if err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	var rows []cli.NodeStatus
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	if len(rows) != 1 || len(rows[0].Instances) != 1 || rows[0].Instances[0].Summary == nil || rows[0].Instances[0].Summary.Pins == nil ||
		rows[0].Instances[0].Summary.Pins.BudgetBytes != budget {
		t.Errorf("status -o json does not show the budget of %d bytes:\n%s", budget, out)
	}
	out, err = c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--kubeconfig", c.Kubeconfig, "--instance", instance).CombinedOutput()
	if want := " of " + disk.Bytes(budget); err != nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), "(ceiling 80%)") {
		t.Errorf("status (%v) does not show %q and the disk against its ceiling:\n%s", err, want, out)
	}
	t.Logf("status:\n%s", out)
}

// Pins follow the list: a list change unpins what left it, and
// uninstalling an instance unpins everything it pinned; another instance's
// pins and the sandbox image's own pin survive both.
func TestPinsFollowTheList(t *testing.T) {
	rt := node(t)
	refs := c.PushData(t, 800, 1<<20, "pins-a", "pins-b")
	a, b := refs[0], refs[1]
	// Budgets in bytes: a share needs the image filesystem's capacity,
	// which the agent reads through a mount of the harness's own path.
	budget := "  pin:\n    budget: 64Mi\n"
	c.Deploy(t, "pins-one", list(a, b, cluster.PauseImage)+budget)
	c.Deploy(t, "pins-two", list(b)+budget)
	allPinned := func(s label.Summary) bool { return s.Pins != nil && s.Pins.Images == s.Total }
	waitSummary(t, "pins-one", "succeeded", 3*time.Minute, allPinned)
	waitSummary(t, "pins-two", "succeeded", 3*time.Minute, allPinned)
	one, two := pin.MarkKey("pins-one", "pins-one"), pin.MarkKey("pins-two", "pins-two")
	for _, r := range []string{a, b, cluster.PauseImage} {
		rt.pinned(t, r, true)
	}
	if l := rt.labels(t, b); l[one] == "" || l[two] == "" || l[pin.SetByKey] != pin.SetByValue {
		t.Errorf("%s labels %v: want both marks and the project's pin", b, l)
	}
	// containerd pinned the sandbox image when it pulled it
	// (pinned_images), before any mark: the pin stays the runtime's.
	if l := rt.labels(t, cluster.PauseImage); l[one] == "" || l[pin.SetByKey] != "" {
		t.Errorf("sandbox image labels %v: want the mark of pins-one, and the pin still the runtime's", l)
	}

	// a and the sandbox image leave the list of pins-one.
	c.Deploy(t, "pins-one", list(b)+budget)
	waitSummary(t, "pins-one", "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Total == 1 && s.Pins != nil && s.Pins.Images == 1 })
	rt.pinned(t, a, false)
	rt.pinned(t, b, true)
	rt.pinned(t, cluster.PauseImage, true)
	if l := rt.labels(t, a); l[one] != "" || l[pin.PinLabel] != "" || l[pin.SetByKey] != "" {
		t.Errorf("%s labels %v: want none of this project's", a, l)
	}
	if l := rt.labels(t, cluster.PauseImage); l[one] != "" || l[pin.PinLabel] != pin.PinValue {
		t.Errorf("sandbox image labels %v: want the mark gone and the runtime's pin kept", l)
	}

	// Uninstalling pins-one leaves pins-two's pin of b.
	uninstall(t, "pins-one")
	rt.pinned(t, b, true)
	if l := rt.labels(t, b); l[one] != "" || l[two] == "" {
		t.Errorf("%s labels %v: want only pins-two's mark", b, l)
	}
	// Uninstalling pins-two unpins b; the sandbox image stays pinned.
	uninstall(t, "pins-two")
	rt.pinned(t, b, false)
	rt.pinned(t, cluster.PauseImage, true)
	if l := rt.labels(t, b); l[two] != "" || l[pin.PinLabel] != "" || l[pin.SetByKey] != "" {
		t.Errorf("%s labels %v: want none of this project's", b, l)
	}
}
