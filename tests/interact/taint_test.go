package interact_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Two instances named web, in team-a and team-b, each with a startup taint
// of its own, on one node. team-a owns the node key and removes its taint
// once its set is there. team-b's agent cannot write the key (it is
// team-a's: InstanceConflict), and team-a's succeeded on that key must not
// remove team-b's taint while team-b's images are missing; once they are
// there, team-b's own run removes it. Neither policy gets in the other's
// way (issue 26, findings 1 and 2). Both lists hold one shared image:
// team-a pins it under its own mark; team-b's runs, which end on the key's
// conflict, leave no mark (their watch never runs, so nothing would remove
// it when team-b goes). Uninstalling team-a removes its marks and pins.
func startupTaintsOfSameNameInstances(t *testing.T) {
	const keyA, keyB = "interact.example.com/team-a", "interact.example.com/team-b"
	node := nodeName(0)
	for _, k := range []string{keyA, keyB} {
		taintNode(t, 0, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
	imgA := c.PushData(t, 2601, 64<<10, "same-a")[0]
	imgB := c.PushData(t, 2602, 64<<10, "same-b")[0]
	shared := c.PushData(t, 2605, 64<<10, "same-shared")[0]
	// team-b's image is missing for its first fetch: three attempts, then
	// the kubelet restarts the init container.
	c.Registry().Fail(registry.Match{Repo: "e2e/same-b"}, 404, 3)

	a := deploy(t, &instance{name: "web", namespace: "interact-team-a", spec: images(imgA, shared) + nodeSpec(0) + pinBudget + "  startupTaint:\n    key: " + keyA + "\n"})
	waitNode(t, node, "team-a labeled, its taint gone, its images pinned", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[a.key()] == "succeeded" && !cluster.HasTaint(n, keyA) && pinsImages(n, a.key(), 2), keyState(n, a.key(), keyA)
	})
	deploy(t, &instance{name: "web", namespace: "interact-team-b", spec: images(imgB, shared) + nodeSpec(0) + pinBudget + "  startupTaint:\n    key: " + keyB + "\n    maxWait: 30m\n"})
	// team-b's first fetch has pulled and failed (its image missing), and
	// met team-a's key: its taint must still be there.
	waitEvent(t, "interact-team-b", "InstanceConflict", 2*time.Minute)
	if n := getNode(t, node); !cluster.HasTaint(n, keyB) {
		t.Errorf("team-b's taint went while team-b's image was missing (team-a's label is %q)", n.Labels[a.key()])
	}
	n := waitNode(t, node, "team-b's taint gone once its image is there", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return !cluster.HasTaint(n, keyB), keyState(n, a.key(), keyB)
	})
	if ann := n.Annotations[a.key()]; n.Labels[a.key()] != "succeeded" || !strings.HasPrefix(ann, `{"owner":{"namespace":"interact-team-a","name":"web",`) {
		t.Errorf("the key changed hands: %q %s", n.Labels[a.key()], ann)
	}

	// team-b's runs pin while they label, and take their mark off when
	// the label meets team-a's key: between runs (the kubelet restarts the
	// init container after a growing back-off) the shared image carries
	// team-a's mark only.
	markA, markB := pin.MarkKey("interact-team-a", "web"), pin.MarkKey("interact-team-b", "web")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last map[string]string
	if err := cluster.Poll(ctx, 200*time.Millisecond, "team-b's mark gone from the shared image", func() (bool, string) {
		var pinned bool
		pinned, last = pinOf(t, 0, shared)
		return pinned && last[markA] != "" && last[markB] == "", fmt.Sprintf("CRI pinned %v, labels %v", pinned, last)
	}); err != nil {
		t.Errorf("shared image: %v: want pinned, with team-a's mark only", err)
	}
	// Uninstalling team-a: its watch removes the key, then its marks.
	remove(t, a)
	if _, l := pinOf(t, 0, shared); l[markA] != "" {
		t.Errorf("shared image after team-a's uninstall: labels %v: team-a's mark is still there", l)
	}
	if pinned, l := pinOf(t, 0, imgA); pinned || l[markA] != "" || l[pin.PinLabel] != "" || l[pin.SetByKey] != "" {
		t.Errorf("team-a's own image after its uninstall: CRI pinned %v, labels %v: want unpinned, no label of this project", pinned, l)
	}
}

// Two instances of different names given the same taint key: each waits
// for its own set. y registers on the node first and fails its first
// pulls; x completes; the key stays until y's set is there too, then goes
// (issue 26, finding 2).
func sharedTaintKey(t *testing.T) {
	const key = "interact.example.com/shared"
	node := nodeName(1)
	taintNode(t, 1, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	imgX := c.PushData(t, 2603, 64<<10, "shared-x")[0]
	imgY := c.PushData(t, 2604, 64<<10, "shared-y")[0]
	// y's fetch (3 attempts) and its watch's first two checks (3 more
	// each) find the image missing; a later check pulls it.
	c.Registry().Fail(registry.Match{Repo: "e2e/shared-y"}, 404, 9)
	taintSpec := "  startupTaint:\n    key: " + key + "\n"

	y := deploy(t, &instance{name: "shared-y", namespace: "interact-shared-y", refresh: 3 * time.Second,
		spec: images(imgY) + nodeSpec(1) + taintSpec + "  refreshInterval: 1m\n"})
	waitNode(t, node, "y registered as a holder of the taint", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return strings.Contains(n.Annotations[y.key()], `"startupTaint":"`+key+`"`), keyState(n, y.key(), key)
	})
	x := deploy(t, &instance{name: "shared-x", namespace: "interact-shared-x", spec: images(imgX) + nodeSpec(1) + taintSpec})
	n := waitNode(t, node, "x succeeded, y failed", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[x.key()] == "succeeded" && n.Labels[y.key()] == "failed", keyState(n, x.key(), key) + "; y " + keyState(n, y.key(), "")
	})
	if !cluster.HasTaint(n, key) {
		t.Errorf("the shared taint went when x succeeded, y still failed")
	}
	n = waitNode(t, node, "the shared taint gone", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return !cluster.HasTaint(n, key), keyState(n, y.key(), key)
	})
	if n.Labels[y.key()] != "succeeded" || n.Labels[x.key()] != "succeeded" {
		t.Errorf("the shared taint went with x %q, y %q", n.Labels[x.key()], n.Labels[y.key()])
	}
}
