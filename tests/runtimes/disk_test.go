package runtimes_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// smallStoreBytes is the image store of the disk cases' nodes: a tmpfs
// small enough to fill in seconds.
const smallStoreBytes = 128 << 20

// diskBound is how soon a full disk must label the node (issue #25).
const diskBound = 30 * time.Second

var (
	smallMu sync.Mutex
	small   = map[string]*node{}
)

// smallNode starts, once per purpose and runtime, a runtime-only node
// whose image store is a tmpfs of smallStoreBytes: each purpose fills its
// own.
func smallNode(t *testing.T, purpose string, rt cluster.Runtime) *node {
	t.Helper()
	smallMu.Lock()
	defer smallMu.Unlock()
	key := purpose + "/" + string(rt)
	if n, ok := small[key]; ok {
		return n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	added, err := c.StartRuntimes(ctx, 1, cluster.RuntimeOptions{Runtime: rt, ImageStoreBytes: smallStoreBytes})
	if err != nil {
		t.Fatalf("start %s with a small image store: %v", rt, err)
	}
	n := &node{rt: rt, node: added[0]}
	small[key] = n
	return n
}

// TestDiskFull runs the agent's fetch on a node whose image store (a
// 128 MiB tmpfs) cannot hold the list, on each runtime: the node is labeled
// failed, with InsufficientDisk for every image that is not there, within
// 30 s; the images that fit are there; the store never reaches the ceiling
// (80%, sampled every 5 ms); and no layer is downloaded twice (no retry).
func TestDiskFull(t *testing.T) {
	forEachSmallNode(t, "full", func(t *testing.T, n *node) {
		rt := n.rt
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		// Images of one 4 MiB layer, 112 MiB in all: on containerd each
		// takes its blob and its unpacked snapshot, on CRI-O its layer
		// (the blob goes to a temporary directory elsewhere). A layer is
		// 3% of the store, as a large one is of a node's disk.
		const images = 28
		var list []string
		for i := range images {
			repo := n.repo(fmt.Sprintf("big-%d", i))
			pushLayers(ctx, t, repo+":v1", int64(200+i), 4<<20)
			list = append(list, n.ref(fmt.Sprintf("big-%d", i), "v1"))
		}
		capacity, before, err := n.node.ImageStoreUsage()
		if err != nil {
			t.Fatal(err)
		}
		limit := capacity / 100 * 80
		t.Logf("%s: image store %d MiB, %d MiB used before, ceiling %d MiB", rt, capacity>>20, before>>20, limit>>20)
		stop := n.node.PeakImageStoreUse()
		res := runAgentIn(ctx, t, n, "disk-full", list, []string{"--disk-ceiling-percent=80"})
		peak := stop()
		t.Logf("%s: label %s after %s, %d of %d images present, peak use %.1f MiB of the %.1f MiB ceiling", rt, res.label, res.elapsed.Round(100*time.Millisecond), res.summary.Present, images, float64(peak)/(1<<20), float64(limit)/(1<<20))
		if len(res.summary.Failed) > 0 {
			t.Logf("%s: %s", rt, res.summary.Failed[0].Message)
		}
		if res.label != "failed" {
			t.Errorf("label %q, want failed", res.label)
		}
		if res.elapsed > diskBound {
			t.Errorf("labeled after %s, want within %s", res.elapsed, diskBound)
		}
		if peak >= limit {
			t.Errorf("the image store reached %d bytes, at or above the ceiling of %d", peak, limit)
		}
		if len(res.summary.Failed) == 0 {
			t.Error("no image failed")
		}
		if res.summary.Present == 0 {
			t.Error("no image is there: the pulls stopped long before the ceiling")
		}
		for _, f := range res.summary.Failed {
			if f.Reason != "InsufficientDisk" {
				t.Errorf("%s: reason %s, want InsufficientDisk: %s", f.Image, f.Reason, f.Message)
			}
		}
		for _, ref := range list {
			if a := res.attempts[ref]; a > 1 {
				t.Errorf("%s: %d attempts, want at most 1: a full disk is not retried", ref, a)
			}
		}
		for i := range images {
			for _, r := range blobGets(n.repo(fmt.Sprintf("big-%d", i))) {
				if r.count > 1 {
					t.Errorf("blob %s downloaded %d times", r.path, r.count)
				}
			}
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", res.log)
		}
	})
}

// forEachSmallNode runs f as parallel subtests, on each runtime's small
// node for purpose.
func forEachSmallNode(t *testing.T, purpose string, f func(t *testing.T, n *node)) {
	for _, rt := range runtimesUnderTest() {
		t.Run(string(rt), func(t *testing.T) {
			t.Parallel()
			n := smallNode(t, purpose, rt)
			createNode(t, n)
			f(t, n)
		})
	}
}

// pushLayers pushes a data image of layers of these sizes, derived from
// seed, as repoTag.
func pushLayers(ctx context.Context, t *testing.T, repoTag string, seed int64, sizes ...int64) {
	t.Helper()
	img, err := ociimage.Data(seed, sizes...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Push(ctx, img, repoTag); err != nil {
		t.Fatalf("push %s: %v", repoTag, err)
	}
}

type blobCount struct {
	path  string
	count int
}

// blobGets counts the GETs of each blob of repo.
func blobGets(repo string) []blobCount {
	counts := map[string]int{}
	var order []string
	for _, r := range c.Registry().Requests(registry.Match{Repo: repo, Kind: registry.Blobs, Method: "GET"}) {
		if counts[r.Path] == 0 {
			order = append(order, r.Path)
		}
		counts[r.Path]++
	}
	out := make([]blobCount, 0, len(order))
	for _, p := range order {
		out = append(out, blobCount{p, counts[p]})
	}
	return out
}
