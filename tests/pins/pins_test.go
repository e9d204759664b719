package pins_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// The prefetched images survive a GC pass that provably ran: the kubelet
// removes an unlisted image nobody uses in the same passes, and the label
// says succeeded throughout. The agent runs at system-node-critical
// priority, which the eviction manager never evicts: its first pass under
// pressure only sees the unlisted image for the first time (too young for
// imageMinimumGCAge), and would evict any other pod.
func TestPrefetchedImagesSurviveImageGC(t *testing.T) {
	rt := node(t)
	refs := c.PushData(t, 900, 4<<20, "gc-a", "gc-b")
	c.Deploy(t, "gc", list(refs...)+"  pin:\n    budget: 64Mi\n  priorityClassName: system-node-critical\n")
	s := waitSummary(t, "gc", "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Pins != nil && s.Pins.Images == 2 })
	if p := s.Pins; p.Bytes < 2*(4<<20) || p.BudgetBytes != 64<<20 || len(p.NotPinned) != 0 || p.Unsupported != "" {
		t.Errorf("pins %+v: want both images, at least their 8 MiB of layers, within 64 MiB", p)
	}
	for _, r := range refs {
		rt.pinned(t, r, true)
	}

	unlisted := c.PushData(t, 950, 48<<20, "gc-unlisted")[0]
	labels := nodeLabels(t, labelDomain+"gc")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	if err := c.Nodes()[0].Pull(ctx, unlisted); err != nil {
		t.Fatal(err)
	}
	unlistedID := rt.status(t, unlisted).GetId()
	if err := cluster.Poll(ctx, 500*time.Millisecond, "the kubelet's image GC to remove "+unlisted, func() (bool, string) {
		return rt.status(t, unlisted) == nil, "still there"
	}); err != nil {
		c.DumpLogs(t)
		t.Fatal(err)
	}
	t.Logf("the kubelet removed the unlisted image %.1fs after its pull", time.Since(start).Seconds())
	for _, r := range refs {
		rt.pinned(t, r, true)
	}
	if seen := labels(); strings.Join(seen, ",") != "succeeded" {
		t.Errorf("the label took the values %v during GC, want succeeded throughout", seen)
	}

	// The kubelet's own account: each pass, and each image it removed.
	log, err := os.ReadFile(filepath.Join(c.Dir, "logs", c.Nodes()[0].Name+"-kubelet.log"))
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
	if len(removed) != 1 || !strings.Contains(removed[0], unlistedID) {
		t.Errorf("the kubelet removed %q, want only the unlisted image %s", removed, unlistedID)
	}
	t.Logf("%d image GC passes under imagefs pressure; removed: %s", passes, unlistedID)
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
