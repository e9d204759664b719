package cluster_test

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// A missing prerequisite fails start-up at once, naming the make target
// that provides it, and leaves no run directory behind.
func TestStartNamesMissingBinaries(t *testing.T) {
	base := t.TempDir()
	for _, nodes := range []int{0, 2} {
		_, err := cluster.Start(context.Background(), cluster.Options{Nodes: nodes, KubeBinDir: t.TempDir(), BaseDir: base, Progress: io.Discard})
		if err == nil {
			t.Fatalf("nodes=%d: start succeeded without Kubernetes binaries", nodes)
		}
		if !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), "make kube") {
			t.Errorf("nodes=%d: error does not say what is missing and how to get it: %v", nodes, err)
		}
		if nodes > 0 && !strings.Contains(err.Error(), "kubelet") {
			t.Errorf("nodes=%d: error does not name the kubelet: %v", nodes, err)
		}
	}
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("failed starts left %d entries in %s", len(entries), base)
	}
}
