package pins_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// The pin budget is the node's (issue 38): a second instance counts the
// first one's pins, pins only what still fits beside them, and the first
// one's pins stay. Each image takes about 6 MiB (3 MiB of content, 3 MiB
// unpacked): one fits the budget of 10 MiB, two do not.
func TestBudgetPerNode(t *testing.T) {
	rt := node(t)
	refs := c.PushData(t, 700, 3<<20, "budget-one", "budget-two")
	const budgetBytes = 10 << 20
	budget := "  pin:\n    budget: 10Mi\n"
	c.Deploy(t, "budget-one", list(refs[0])+budget)
	one := waitSummary(t, "budget-one", "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Pins != nil && s.Pins.Images == 1 })
	c.Deploy(t, "budget-two", list(refs[1])+budget)
	two := waitSummary(t, "budget-two", "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Pins != nil && len(s.Pins.NotPinned) == 1 })
	if r := two.Pins.NotPinned[0].Reason; r != pin.ReasonOverBudget {
		t.Errorf("budget-two's image not pinned for %s, want %s: %s", r, pin.ReasonOverBudget, two.Pins.NotPinned[0].Message)
	}
	// budget-one's next checks keep its pin.
	one = waitSummary(t, "budget-one", "succeeded", time.Minute, func(s label.Summary) bool { return s.Pins != nil })
	rt.pinned(t, refs[0], true)
	rt.pinned(t, refs[1], false)
	if sum := one.Pins.Bytes + two.Pins.Bytes; sum > budgetBytes || one.Pins.Images != 1 || two.Pins.Images != 0 {
		t.Errorf("pinned %d + %d bytes (%d and %d images), want one image within the node's budget of %d", one.Pins.Bytes, two.Pins.Bytes, one.Pins.Images, two.Pins.Images, budgetBytes)
	}
	t.Logf("budget-one pins %d bytes; budget-two: %s", one.Pins.Bytes, two.Pins.NotPinned[0].Message)
	uninstall(t, "budget-one")
	uninstall(t, "budget-two")
}

// Uninstalling an instance with 150 pinned images leaves none of its marks
// (issue 38, finding 4: one by one, within 2 s, 54 stayed).
func TestUninstallLeavesNoMarks(t *testing.T) {
	rt := node(t)
	var names []string
	for i := range 150 {
		names = append(names, fmt.Sprintf("many-%d", i))
	}
	refs := c.PushData(t, 1000, 512, names...)
	c.Deploy(t, "many", list(refs...)+"  pin:\n    budget: 1Gi\n")
	waitSummary(t, "many", "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Pins != nil && s.Pins.Images == 150 })
	mark := pin.MarkKey("many", "many")
	start := time.Now()
	uninstall(t, "many")
	t.Logf("uninstalled in %.1fs", time.Since(start).Seconds())
	left := 0
	for _, r := range refs {
		if l := rt.labels(t, r); l[mark] != "" || l[pin.SetByKey] != "" {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d of 150 records still carry the mark or the project's pin", left)
	}
}

// With spec.nodeLabel.enabled: false the agent writes no key, and
// uninstalling the instance still leaves none of its marks.
func TestUninstallWithoutLabelLeavesNoMarks(t *testing.T) {
	rt := node(t)
	refs := c.PushData(t, 1200, 512, "nolabel-a", "nolabel-b")
	c.Deploy(t, "nolabel", list(refs...)+"  nodeLabel:\n    enabled: false\n  pin:\n    budget: 1Gi\n")
	mark := pin.MarkKey("nolabel", "nolabel")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cluster.Poll(ctx, 250*time.Millisecond, "both images marked by nolabel", func() (bool, string) {
		for _, r := range refs {
			l, err := rt.n.ImageLabels(ctx, r)
			if err != nil || l[mark] == "" {
				return false, fmt.Sprintf("%s: %v %v", r, l, err)
			}
		}
		return true, ""
	}); err != nil {
		c.DumpLogs(t)
		t.Fatal(err)
	}
	uninstall(t, "nolabel")
	for _, r := range refs {
		if l := rt.labels(t, r); l[mark] != "" || l[pin.SetByKey] != "" {
			t.Errorf("%s still carries the mark or the project's pin: %v", r, l)
		}
	}
}
