package quickstart_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
)

// busybox is the quickstart's image the ceiling check takes off the nodes.
const busybox = "docker.io/library/busybox:1.37"

// driftPoints is how far the annotation's usage may lag the disk: the
// agent rewrites it for the usage alone past 5 percentage points
// (agent/label diskDriftPoints), to spare the apiserver.
const driftPoints = 5

// onNode is the quickstart as one node runs it.
type onNode struct {
	node *cluster.Node
	// dir is the kustomization demo.Deploy renders for the node.
	dir string
	dep *demo.Deployment
}

// Issue 48, "Done when": on the containerd 2 node and the CRI-O node, with
// the default rendering and self-signed kubelets, the agents report the
// image filesystem's real figures (the kubelet's own, read through the
// apiserver's node proxy); the containerd node pins the list within the
// default budget, 25% of its image filesystem, and containerd's CRI says
// so; the CRI-O node says, truthfully, that it cannot pin; `status` shows
// each node's pins and usage against the ceiling. Then each node's store
// is filled past the default ceiling of 80% and busybox is removed, as
// `crictl rmi` would: watch notices, and its pull is refused as
// InsufficientDisk on the figures the kubelet also has.
func TestQuickstartFiguresPinsAndCeiling(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	quickstart := quickstartDir(t)
	nodes := c.Nodes()
	on := []*onNode{
		{node: nodes[0], dir: containerdOverlay(t, quickstart)},
		{node: nodes[1], dir: crioCopy(t, quickstart)},
	}
	deployAll(ctx, t, on)
	t.Logf("both nodes labeled %.1fs after the test's start", time.Since(begin).Seconds())
	for _, o := range on {
		s := o.settled(ctx, t)
		o.checkFigures(ctx, t, s)
		o.checkPins(ctx, t, s)
		o.checkStatus(ctx, t, s)
	}
	t.Logf("figures, pins and status checked %.1fs after the test's start", time.Since(begin).Seconds())
	if t.Failed() {
		return
	}
	removed := time.Now()
	for _, o := range on {
		o.passCeiling(ctx, t)
	}
	for _, o := range on {
		o.checkRefused(ctx, t, removed)
	}
	t.Logf("the test took %.1fs", time.Since(begin).Seconds())
}

// deployAll deploys each node's kustomization at once, as `make demo`
// deploys the quickstart, and waits until each selected node is labeled.
func deployAll(ctx context.Context, t *testing.T, on []*onNode) {
	t.Helper()
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	agent := c.AgentImage(t)
	errs := make([]error, len(on))
	var wg sync.WaitGroup
	for i, o := range on {
		wg.Go(func() {
			o.dep, errs[i] = demo.Deploy(ctx, c, demo.Options{
				BinDir: bin, Example: o.dir, AgentRef: agent, Timeout: 3 * time.Minute,
				Progress: func(format string, args ...any) { t.Logf(o.node.Name+": "+format, args...) },
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.DumpLogs(t)
		t.Fatal(err)
	}
	for _, o := range on {
		if want := o.node.Name + "=succeeded"; len(o.dep.Labeled) != 1 || o.dep.Labeled[0] != want {
			t.Errorf("%s selects %v, want only %s", o.dep.Instance, o.dep.Labeled, want)
		}
	}
}

// settled waits until the node's key says succeeded with the pins and the
// disk accounted for (fetch pins while it labels), and returns the
// annotation.
func (o *onNode) settled(ctx context.Context, t *testing.T) label.Summary {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var s label.Summary
	_, err := c.WaitNode(wctx, o.node.Name, func(n *corev1.Node) bool {
		var err error
		if s, err = label.Parse(n.Annotations[o.dep.Key]); err != nil || n.Labels[o.dep.Key] != "succeeded" {
			return false
		}
		p := s.Pins
		return s.Disk != nil && p != nil && (p.Unsupported != "" || p.Images == len(o.dep.Images))
	})
	if err != nil {
		c.DumpLogs(t)
		t.Fatalf("%s: %s with its pins: %v", o.node.Name, o.dep.Instance, err)
	}
	return s
}

// kubeletPercent is how full the kubelet says the node's image filesystem
// is, and the figures it says it from, once ok holds for them (nil:
// anything), at most a minute: the kubelet's figures follow the disk at
// its stats provider's pace (on CRI-O, cAdvisor's housekeeping, every
// 10-15 s).
func (o *onNode) kubeletPercent(ctx context.Context, t *testing.T,
	ok func(cluster.ImageFs) bool) (int, cluster.ImageFs) {
	t.Helper()
	kctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fs, err := c.KubeletImageFs(kctx, o.node.Name, ok)
	if err != nil {
		t.Fatal(err)
	}
	return percent(fs), fs
}

func percent(fs cluster.ImageFs) int {
	return label.Disk{UsedBytes: fs.FsUsed(), CapacityBytes: fs.CapacityBytes}.Percent()
}

// within is whether the kubelet puts the usage within the annotation's
// drift of p.
func within(p int) func(cluster.ImageFs) bool {
	return func(fs cluster.ImageFs) bool {
		diff := percent(fs) - p
		return diff < driftPoints && -diff < driftPoints
	}
}

// checkFigures: the agent's figures are the image filesystem the kubelet
// reports, the node's 192 MiB store, against the default ceiling.
func (o *onNode) checkFigures(ctx context.Context, t *testing.T, s label.Summary) {
	t.Helper()
	d := s.Disk
	kubelet, fs := o.kubeletPercent(ctx, t, within(d.Percent()))
	if d.Unknown != "" || d.CapacityBytes != storeBytes || fs.CapacityBytes != storeBytes || d.CeilingPercent != 80 {
		t.Errorf("%s: the agent's disk %+v, the kubelet's %+v: want both the node's %d-byte store, and the ceiling of 80%%",
			o.node.Name, d, fs, storeBytes)
	}
	t.Logf("%s: the agent's disk %+v, %d%%; the kubelet's %d%%", o.node.Name, *d, d.Percent(), kubelet)
}

// checkPins: on containerd 2 the whole list is pinned within the default
// budget, as containerd's CRI (what the kubelet's GC reads) and the
// instance's mark on each image record say; CRI-O cannot pin, and the
// agent says so.
func (o *onNode) checkPins(ctx context.Context, t *testing.T, s label.Summary) {
	t.Helper()
	p := s.Pins
	canPin := o.node.Runtime == cluster.Containerd2
	if !canPin {
		if p.Unsupported == "" || p.Images != 0 {
			t.Errorf("%s: pins %+v, want pinning unsupported", o.node.Name, *p)
		}
	} else if budget := uint64(storeBytes) / 100 * 25; p.Unsupported != "" || p.Error != "" || len(p.NotPinned) != 0 ||
		p.Images != len(o.dep.Images) || p.BudgetBytes != budget || p.Bytes == 0 || p.Bytes > budget {
		t.Errorf("%s: pins %+v, want all %d images within the default budget of %d bytes (25%% of the store)",
			o.node.Name, *p, len(o.dep.Images), budget)
	}
	mark := pin.MarkKey(o.dep.Namespace, o.dep.Instance)
	for _, ref := range o.dep.Images {
		img, err := o.node.Image(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if img == nil {
			t.Errorf("%s: %s is not on the node", o.node.Name, ref)
			continue
		}
		if !canPin {
			// CRI-O pins its own pause image; nothing else.
			if img.GetPinned() != (ref == cluster.PauseImage) {
				t.Errorf("%s: CRI-O says %s pinned = %v", o.node.Name, ref, img.GetPinned())
			}
			continue
		}
		labels, err := o.node.ImageLabels(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !img.GetPinned() || labels[mark] == "" {
			t.Errorf("%s: %s: CRI pinned = %v, labels %v: want it pinned, with the mark of %s", o.node.Name, ref,
				img.GetPinned(), labels, o.dep.Instance)
		}
	}
	t.Logf("%s: pins %+v", o.node.Name, *p)
}

// status runs `image-prefetcher status` from ./bin for the node's
// instance on the node, and returns its output and whether it exited 0.
func (o *onNode) status(ctx context.Context, t *testing.T) (string, bool) {
	t.Helper()
	out, err := c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--kubeconfig", c.Kubeconfig,
		"--instance", o.dep.Instance, "-l", runtimeLabel+"="+string(o.node.Runtime)).CombinedOutput()
	t.Logf("%s: status:\n%s", o.node.Name, out)
	return string(out), err == nil
}

// statusRow matches the node's row of status's table, with pinned and
// failures as they must read, and captures the IMAGE-FS usage.
func (o *onNode) statusRow(state, pinned, failures string) *regexp.Regexp {
	q := regexp.QuoteMeta
	return regexp.MustCompile(fmt.Sprintf(`(?m)^%s +%s +%s +%s +\d+/%d +%s +(\d+)%% \(ceiling 80%%\) +%s$`,
		q(o.node.Name), q(o.dep.Instance), state, q(o.dep.Namespace+"/"+o.dep.Instance), len(o.dep.Images), q(pinned),
		failures))
}

// pinnedCell is what status's PINNED column must read for s.
func pinnedCell(s label.Summary) string {
	if p := s.Pins; p != nil && p.Unsupported == "" {
		return fmt.Sprintf("%d, %s of %s", p.Images, disk.Bytes(p.Bytes), disk.Bytes(p.BudgetBytes))
	}
	return "pinning unsupported"
}

// checkStatus: status shows the node succeeded, its pins ("N, used of
// budget" or "pinning unsupported") and its image filesystem against the
// ceiling, the kubelet's figure within the annotation's drift.
func (o *onNode) checkStatus(ctx context.Context, t *testing.T, s label.Summary) {
	t.Helper()
	pinned := pinnedCell(s)
	out, ok := o.status(ctx, t)
	m := o.statusRow("succeeded", pinned, "-").FindStringSubmatch(out)
	if !ok || m == nil {
		t.Errorf("%s: status (exit 0: %v) has no row of %s succeeded, pinned %q, IMAGE-FS NN%% (ceiling 80%%)",
			o.node.Name, ok, o.dep.Instance, pinned)
		return
	}
	shown, _ := strconv.Atoi(m[1])
	kubelet, _ := o.kubeletPercent(ctx, t, within(shown))
	t.Logf("%s: status shows %d%% used, the kubelet %d%%", o.node.Name, shown, kubelet)
}

// passCeiling fills the node's store to 90%, past the ceiling, and then
// removes busybox from the node through its CRI.
func (o *onNode) passCeiling(ctx context.Context, t *testing.T) {
	t.Helper()
	remove, err := o.node.FillImageStore(90)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Error(err)
		}
	})
	if err := o.node.Remove(ctx, busybox); err != nil {
		t.Fatal(err)
	}
}

// checkRefused: watch pulled busybox again and the ceiling refused it
// (InsufficientDisk), on figures the kubelet has too (the store holds
// still meanwhile: both runtimes free an image's bytes before RemoveImage
// returns); busybox stays off the node and status shows why.
func (o *onNode) checkRefused(ctx context.Context, t *testing.T, removed time.Time) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	refused := cluster.LabelIs(o.dep.Key, "failed", "InsufficientDisk")
	n, err := c.WaitNode(wctx, o.node.Name, func(n *corev1.Node) bool {
		// and the pins of what is present, which the check syncs after
		// it labels.
		s, err := label.Parse(n.Annotations[o.dep.Key])
		return refused(n) && err == nil && s.Pins != nil && (s.Pins.Unsupported != "" || s.Pins.Images == s.Present)
	})
	if err != nil {
		c.DumpLogs(t)
		t.Fatalf("%s: %s not refused for the ceiling: %v", o.node.Name, busybox, err)
	}
	t.Logf("%s: labeled failed (InsufficientDisk) %.1fs after the removal", o.node.Name, time.Since(removed).Seconds())
	s, err := label.Parse(n.Annotations[o.dep.Key])
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Failed) != 1 || s.Failed[0].Image != busybox {
		t.Errorf("%s: failures %+v, want only %s", o.node.Name, s.Failed, busybox)
	}
	if there, err := o.node.HasImage(ctx, busybox); err != nil || there {
		t.Errorf("%s: %s on the node: %v (%v), want it refused at the ceiling", o.node.Name, busybox, there, err)
	}
	_, used, err := o.node.ImageStoreUsage()
	if err != nil {
		t.Fatal(err)
	}
	tolerance := uint64(storeBytes / 100)
	near := func(a, b uint64) bool { return max(a, b)-min(a, b) <= tolerance }
	kubelet, fs := o.kubeletPercent(ctx, t, func(fs cluster.ImageFs) bool { return near(fs.FsUsed(), used) })
	d := s.Disk
	if d == nil {
		t.Fatalf("%s: annotation %+v has no disk figures", o.node.Name, s)
	}
	if d.CapacityBytes != fs.CapacityBytes || d.Percent() < 80 || !near(d.UsedBytes, fs.FsUsed()) {
		t.Errorf("%s: refused on the agent's disk %+v; the kubelet's %+v: want the same figures within 1%%, past 80%%",
			o.node.Name, d, fs)
	}
	t.Logf("%s: refused at %d%% (the kubelet: %d%%): %s", o.node.Name, d.Percent(), kubelet, s.Failed[0].Message)
	out, ok := o.status(ctx, t)
	if ok || o.statusRow("failed", pinnedCell(s), regexp.QuoteMeta(busybox+" (InsufficientDisk)")).FindString(out) == "" {
		t.Errorf("%s: status (exit 0: %v) does not show %s failed, %s refused at the ceiling", o.node.Name, ok,
			o.dep.Instance, busybox)
	}
}
