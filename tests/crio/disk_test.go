package crio_test

import (
	"context"
	"testing"
	"time"
)

// With the default rendering (no spec.disk.imageFilesystem, nothing of the
// node mounted) and a kubelet serving a self-signed certificate (kubeadm's
// default, which the agent sends no token to), the agent on CRI-O knows
// the image filesystem's figures, the kubelet's own, from its own root
// filesystem (issue 48), and its ceiling holds pulls back: at 1%, below
// what the node's disk already holds, no pull starts. spec.disk.kubeletStats
// is false: the agent has no nodes/stats grant and never calls the kubelet.
func TestCRIODiskFiguresAndCeiling(t *testing.T) {
	refs := images(t, 720, "crio-disk")
	deploy(t, "crio-disk", list(refs...)+"  disk:\n    ceilingPercent: 1\n    kubeletStats: false\n")
	s := waitLabel(t, "crio-disk", "failed", 3*time.Minute)
	if len(s.Failed) != 1 || s.Failed[0].Reason != "InsufficientDisk" {
		t.Errorf("failures %+v, want %s refused for InsufficientDisk", s.Failed, refs[0])
	}
	if present(t, refs[0]) {
		t.Errorf("%s was pulled above the ceiling", refs[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs, err := c.KubeletImageFs(ctx, c.Nodes()[0].Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, kubeletAvail := fs.CapacityBytes, fs.AvailableBytes
	if d := s.Disk; d == nil || d.Unknown != "" || d.CapacityBytes != kubelet || d.CeilingPercent != 1 {
		t.Errorf("annotation's disk %+v, want the kubelet's capacity of %d bytes and the ceiling of 1%%", d, kubelet)
	}
	// Used as the kubelet counts it, within what the host's other writers
	// change between the two readings (the store is on the host's disk).
	if d := s.Disk; d != nil && absDiff(d.UsedBytes, kubelet-kubeletAvail) > kubelet/50 {
		t.Errorf("annotation's used bytes %d, the kubelet's %d: more than 2%% of the capacity apart", d.UsedBytes, kubelet-kubeletAvail)
	}
	t.Logf("disk %+v; %s", s.Disk, s.Failed[0].Message)
}

func absDiff(a, b uint64) uint64 { return max(a, b) - min(a, b) }
