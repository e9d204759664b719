package runtimes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// TestCancelledPullStartsOver records why a pull attempt cut by its
// deadline wastes registry egress (docs/agent.md, "Attempt timeouts and
// progress"): no runtime resumes a PullImage call its caller cancelled.
// A two-layer image is pulled with the second layer held mid-blob until
// the call's deadline cuts it, then pulled again a second later, as the
// agent's retry does. No runtime asks for the rest of the cut layer (no
// Range request): each fetches it again from its first byte. containerd
// 1.6 and 2.x fetch the complete first layer again too; CRI-O keeps it. So
// an attempt cut after receiving B bytes of an image wastes all B on
// containerd, and all of the layers still in flight on CRI-O.
//
// It also checks what the agent reads instead (cri.Client.Downloads): on
// containerd, the held blob is listed with exactly the bytes it got.
//
// If a runtime ever starts resuming, this test fails: the attempt timeout
// could then be plain again on it.
func TestCancelledPullStartsOver(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, n *node) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const small, big, cut = 2 << 20, 16 << 20, 6 << 20
		img, err := ociimage.Data(41, small, big)
		if err != nil {
			t.Fatal(err)
		}
		repo := n.repo("starts-over")
		if err := c.Push(ctx, img, repo+":v1"); err != nil {
			t.Fatal(err)
		}
		first, second := layerBlob(t, img, 0), layerBlob(t, img, 1)
		c.Registry().StallAfter(registry.Match{Repo: repo, Ref: second.digest}, 1, cut, 0)
		client, err := cri.Dial(n.node.CRISocket)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		ref := n.ref("starts-over", "v1")
		fresh(ctx, t, n, ref)
		since := len(c.Registry().Requests(registry.Match{}))

		pctx, pcancel := context.WithTimeout(ctx, 4*time.Second)
		seen := make(chan map[string]int64, 1)
		go func() {
			// What the agent's progress watch sees while the blob is held.
			m := registry.Match{Repo: repo, Ref: second.digest}
			for c.Registry().Stalled(m) == 0 && pctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(time.Second)
			d, err := client.Downloads(ctx)
			if err != nil {
				t.Logf("Downloads: %v", err)
			}
			seen <- d
		}()
		if _, err := client.PullImage(pctx, ref, nil); err == nil {
			t.Fatal("the first pull succeeded with a layer held mid-blob")
		}
		pcancel()
		downloads := <-seen
		if n.rt != cluster.CRIO {
			if got := downloads["layer-"+second.digest]; got != cut {
				t.Errorf("containerd lists the held layer with %d bytes (downloads %v), want %d", got, downloads, cut)
			}
		}

		retryAfterCut(ctx, t, n, client, "layer-"+second.digest)
		if _, err := client.PullImage(ctx, ref, nil); err != nil {
			t.Fatalf("second pull: %v", err)
		}
		var firstGets, secondGets []registry.Request
		for _, q := range c.Registry().Requests(registry.Match{})[since:] {
			if q.Method != "GET" {
				continue
			}
			switch q.Path {
			case "/v2/" + repo + "/blobs/" + first.digest:
				firstGets = append(firstGets, q)
			case "/v2/" + repo + "/blobs/" + second.digest:
				secondGets = append(secondGets, q)
			}
		}
		for _, q := range append(firstGets, secondGets...) {
			t.Logf("GET %s range=%q bytes=%d", q.Path, q.Range, q.Bytes)
		}
		if len(secondGets) != 2 || secondGets[0].Bytes != cut || secondGets[1].Range != "" || secondGets[1].Bytes != second.size {
			t.Errorf("held layer: GETs %+v, want the cut one (%d bytes) and a whole new one from byte 0 (%d bytes, no Range)", secondGets, cut, second.size)
		}
		// containerd drops the layers it completed with the cancelled
		// call; CRI-O keeps them.
		wantFirst := 2
		if n.rt == cluster.CRIO {
			wantFirst = 1
		}
		if len(firstGets) != wantFirst {
			t.Errorf("complete layer: %d GETs %+v, want %d", len(firstGets), firstGets, wantFirst)
		}
		for _, q := range firstGets {
			if q.Bytes != first.size {
				t.Errorf("complete layer: GET of %d bytes, want the whole %d", q.Bytes, first.size)
			}
		}
	})
}

// retryAfterCut waits as the agent's retry does before pulling again. On
// containerd it waits until the runtime has dropped the cut download,
// which takes about a second on an idle machine and longer on a loaded
// one: pulled again while the partial blob is still in its content store,
// containerd 1.6 asks for the rest of it with a Range request. That is
// not what the agent's retries meet, and would make the test depend on
// the machine's load.
func retryAfterCut(ctx context.Context, t *testing.T, n *node, client *cri.Client, ref string) {
	t.Helper()
	if n.rt == cluster.CRIO {
		// CRI-O lists no downloads; the agent's shortest retry delay.
		time.Sleep(time.Second)
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, err := client.Downloads(ctx)
		if err != nil {
			t.Fatalf("Downloads: %v", err)
		}
		if _, held := d[ref]; !held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd still holds the cut download %s 30 s after the call was cancelled (%v): it now keeps partial downloads, so a retry may resume", ref, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSlowPullIsNotCut runs the agent against a registry that serves an
// 8 MiB image at 1 MiB/s, with an attempt timeout of 5 s. On containerd the
// agent sees the bytes arriving and lets the one attempt finish: the
// registry serves the image exactly once. containerd stores a blob 1 MiB
// at a time, so each of the two layers, at 0.5 MiB/s, grows every 2 s: a
// timeout of 3 s left too little room under load (a fresh-clone run saw
// no growth for 3 s). CRI-O reports no progress, so its first attempt is
// cut at 5 s and the second (10 s) gets it: what the first was served is
// wasted, as TestCancelledPullStartsOver shows.
func TestSlowPullIsNotCut(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, n *node) {
		createNode(t, n)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		img, err := ociimage.Data(42, 4<<20, 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		repo := n.repo("slow")
		if err := c.Push(ctx, img, repo+":v1"); err != nil {
			t.Fatal(err)
		}
		need := layerBlob(t, img, 0).size + layerBlob(t, img, 1).size
		c.Registry().Throttle(registry.Match{Repo: repo}, 1<<20)
		ref := n.ref("slow", "v1")
		fresh(ctx, t, n, ref)
		since := len(c.Registry().Requests(registry.Match{}))
		res := runAgent(ctx, t, n, "slow-pull", []string{ref},
			[]string{"--initial-pull-attempt-timeout=5s", "--max-pull-attempt-timeout=12s", "--overall-timeout=90s", "--log-level=debug"})
		var served int64
		for _, q := range c.Registry().Requests(registry.Match{})[since:] {
			if q.Method == "GET" && strings.HasPrefix(q.Path, "/v2/"+repo+"/blobs/") {
				served += q.Bytes
			}
		}
		ratio := float64(served) / float64(need)
		t.Logf("%s: %d attempts, served %d bytes for %d needed (%.2fx), labeled %s after %s", n.rt, res.attempts[ref], served, need, ratio, res.label, res.elapsed.Round(100*time.Millisecond))
		if res.label != "succeeded" {
			t.Fatalf("label %q, annotation %s\n%s", res.label, res.annotation, res.log)
		}
		if n.rt == cluster.CRIO {
			if res.attempts[ref] < 2 || served <= need {
				t.Errorf("CRI-O: %d attempts serving %.2fx; want attempts cut by their timeout (no progress to read) and more than 1x served", res.attempts[ref], ratio)
			}
			return
		}
		if res.attempts[ref] != 1 || served > need+need/50 {
			t.Errorf("%d attempts, served %.2fx; want one attempt, never cut while bytes arrive, and at most 1.02x served\n%s", res.attempts[ref], ratio, res.log)
		}
	})
}

// fresh removes ref from n's runtime, so that a test run again in the same
// cluster (-count) pulls it again.
func fresh(ctx context.Context, t *testing.T, n *node, ref string) {
	t.Helper()
	if err := n.node.Remove(ctx, ref); err != nil {
		t.Fatal(err)
	}
}

type blob struct {
	digest string
	size   int64
}

// layerBlob is img's i-th layer as the registry serves it.
func layerBlob(t *testing.T, img v1.Image, i int) blob {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := layers[i].Digest()
	if err != nil {
		t.Fatal(err)
	}
	size, err := layers[i].Size()
	if err != nil {
		t.Fatal(err)
	}
	return blob{digest: d.String(), size: size}
}
