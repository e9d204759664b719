package registry_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// A transfer held mid-blob sends exactly the bytes before the stall; the
// request log keeps each request's Range, so a test can tell a client that
// resumes from one that starts over.
func TestStallAfterAndRange(t *testing.T) {
	f := newFixture(t)
	const after = 100 << 10
	f.reg.StallAfter(registry.Match{Ref: f.layer.String()}, 1, after, 0)
	blob := "http://" + f.addr + "/v2/app/blobs/" + f.layer.String()

	if got := f.stalledGet(t, 500*time.Millisecond); len(got) != after {
		t.Fatalf("read %d bytes before the stall, want %d", len(got), after)
	}
	// The server logs a request when its handler returns, which for the
	// stalled one is when it notices the client left: wait for that entry,
	// or the ranged GET below can be logged first.
	waitLogged(t, f.reg, registry.Match{Kind: registry.Blobs}, 1, "the stalled GET")

	req, _ := http.NewRequest(http.MethodGet, blob, nil)
	req.Header.Set("Range", "bytes=102400-")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusPartialContent {
		t.Fatalf("ranged GET = %d, %v", resp.StatusCode, err)
	}
	if want := 256<<10 + 2048 - after; len(rest) > want || len(rest) < 256<<10-after {
		t.Fatalf("ranged GET sent %d bytes, want the rest of the blob", len(rest))
	}
	// Its handler may return a moment after the client has read it all.
	waitLogged(t, f.reg, registry.Match{Kind: registry.Blobs}, 2, "the ranged GET")
	reqs := f.reg.Requests(registry.Match{Kind: registry.Blobs})
	if len(reqs) != 2 {
		t.Fatalf("%d blob requests logged, want 2: %+v", len(reqs), reqs)
	}
	if reqs[0].Range != "" || reqs[0].Bytes != after {
		t.Errorf("first request logged as %+v, want no Range and %d bytes", reqs[0], after)
	}
	if reqs[1].Range != "bytes=102400-" || reqs[1].Bytes != int64(len(rest)) {
		t.Errorf("second request logged as %+v, want Range bytes=102400- and %d bytes", reqs[1], len(rest))
	}
}

// A throttled repository's blobs come at its own rate; the others at full
// speed.
func TestThrottle(t *testing.T) {
	f := newFixture(t)
	f.reg.Throttle(registry.Match{Repo: "app"}, 512<<10)
	start := time.Now()
	code, _, body := f.get(t, nil, "/v2/app/blobs/"+f.layer.String())
	if code != http.StatusOK || len(body) < 256<<10 {
		t.Fatalf("GET = %d with %d bytes", code, len(body))
	}
	// 256 KiB at 512 KiB/s: half a second, less the first write the
	// limiter lets through at once.
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("throttled blob served in %v", d)
	}
	f.reg.ClearFaults()
	start = time.Now()
	if code, _, _ := f.get(t, nil, "/v2/app/blobs/"+f.layer.String()); code != http.StatusOK {
		t.Fatalf("GET = %d", code)
	}
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Fatalf("blob served in %v after ClearFaults removed the throttle", d)
	}
}

// waitLogged waits, at most 5 s, until reg has logged n requests that
// match m. A request is logged when its handler returns, which can be a
// moment after the client has read the whole answer.
func waitLogged(t *testing.T, reg *registry.Registry, m registry.Match, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(reg.Requests(m)) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%s was not logged within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
