package registry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// fixture is a registry on loopback holding one image, app:v1, with one
// 256 KiB layer.
type fixture struct {
	reg   *registry.Registry
	addr  string
	img   v1.Image
	layer v1.Hash
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	reg := registry.New()
	addr, stop, err := reg.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	img, err := ociimage.Data(1, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Push(context.Background(), img, addr+"/app:v1"); err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg.ResetStats()
	return &fixture{reg: reg, addr: addr, img: img, layer: d}
}

// stalledGet GETs the layer's blob with a deadline d: the headers must
// come, and reading the body must end at the deadline. It returns the
// bytes read before it.
func (f *fixture) stalledGet(t *testing.T, d time.Duration) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.addr+"/v2/app/blobs/"+f.layer.String(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("stalled GET returned no headers: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("reading the stalled body: err = %v, want deadline exceeded", err)
	}
	return got
}

func (f *fixture) get(t *testing.T, client *http.Client, path string, auth ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+f.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	if len(auth) == 2 {
		req.SetBasicAuth(auth[0], auth[1])
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return resp.StatusCode, resp.Header, body
}

func TestFailFirstN(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusUnauthorized, http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			f := newFixture(t)
			f.reg.Fail(registry.Match{Repo: "app", Kind: registry.Manifests}, status, 2)
			var got []int
			for range 3 {
				code, _, _ := f.get(t, nil, "/v2/app/manifests/v1")
				got = append(got, code)
			}
			want := []int{status, status, http.StatusOK}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("statuses = %v, want %v", got, want)
			}
			// The count is per manifest: another one fails on its own.
			if code, _, _ := f.get(t, nil, "/v2/app/manifests/nope"); code != status {
				t.Fatalf("first request for another manifest = %d, want %d", code, status)
			}
			// Blobs are not matched by a manifest rule.
			if code, _, _ := f.get(t, nil, "/v2/app/blobs/"+f.layer.String()); code != http.StatusOK {
				t.Fatalf("blob = %d, want 200", code)
			}
		})
	}
}

// A client resolves a tag, then fetches by digest: both count against
// the same manifest.
func TestFailCountsTagAndDigestTogether(t *testing.T) {
	f := newFixture(t)
	d, err := f.img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	f.reg.Fail(registry.Match{Repo: "app", Kind: registry.Manifests}, http.StatusServiceUnavailable, 2)
	got := []int{}
	for _, p := range []string{"/v2/app/manifests/v1", "/v2/app/manifests/" + d.String(), "/v2/app/manifests/v1", "/v2/app/manifests/" + d.String()} {
		code, _, _ := f.get(t, nil, p)
		got = append(got, code)
	}
	if want := []int{503, 503, 200, 200}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
}

func TestFailAlways(t *testing.T) {
	f := newFixture(t)
	f.reg.Fail(registry.Match{Kind: registry.Blobs, Ref: f.layer.String()}, http.StatusNotFound, 0)
	for range 3 {
		if code, _, body := f.get(t, nil, "/v2/app/blobs/"+f.layer.String()); code != http.StatusNotFound {
			t.Fatalf("blob = %d %s, want 404", code, body)
		}
	}
	if code, _, _ := f.get(t, nil, "/v2/app/manifests/v1"); code != http.StatusOK {
		t.Fatalf("manifest = %d, want 200", code)
	}
	f.reg.ClearFaults()
	if code, _, _ := f.get(t, nil, "/v2/app/blobs/"+f.layer.String()); code != http.StatusOK {
		t.Fatalf("blob after ClearFaults = %d, want 200", code)
	}
}

func TestRequireAuth(t *testing.T) {
	f := newFixture(t)
	// Push the private image with the credentials the repository will need.
	f.reg.RequireAuth("private/*", "alice", "s3cret")
	if err := ociimage.Push(context.Background(), f.img, f.addr+"/private/app:v1", remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	tests := []struct {
		name string
		path string
		auth []string
		want int
	}{
		{"anonymous", "/v2/private/app/manifests/v1", nil, http.StatusUnauthorized},
		{"wrong password", "/v2/private/app/manifests/v1", []string{"alice", "nope"}, http.StatusUnauthorized},
		{"right credentials", "/v2/private/app/manifests/v1", []string{"alice", "s3cret"}, http.StatusOK},
		{"missing tag answers 401 without credentials", "/v2/private/app/manifests/missing", nil, http.StatusUnauthorized},
		{"missing tag answers 404 with credentials", "/v2/private/app/manifests/missing", []string{"alice", "s3cret"}, http.StatusNotFound},
		{"public repository needs nothing", "/v2/app/manifests/v1", nil, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, hdr, _ := f.get(t, nil, tt.path, tt.auth...)
			if code != tt.want {
				t.Fatalf("status = %d, want %d", code, tt.want)
			}
			if code == http.StatusUnauthorized && hdr.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without a WWW-Authenticate challenge")
			}
		})
	}
	// A real client follows the Basic challenge.
	ref, err := name.ParseReference(f.addr+"/private/app:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(ref, remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
	if _, err := remote.Image(ref); err == nil {
		t.Fatal("anonymous pull of the private image succeeded")
	}
}

func TestStall(t *testing.T) {
	f := newFixture(t)
	f.reg.Stall(registry.Match{Ref: f.layer.String()}, 1, 0)
	// The first transfer sends headers, then nothing: a client with a
	// deadline gives up.
	f.stalledGet(t, 300*time.Millisecond)
	// The next attempt is served in full.
	code, _, body := f.get(t, nil, "/v2/app/blobs/"+f.layer.String())
	if code != http.StatusOK || len(body) == 0 {
		t.Fatalf("second GET = %d with %d bytes", code, len(body))
	}
	if got := (v1.Hash{Algorithm: "sha256", Hex: sha256Hex(body)}); got != f.layer {
		t.Fatalf("second GET body digest = %s, want %s", got, f.layer)
	}
}

func TestHold(t *testing.T) {
	f := newFixture(t)
	m := registry.Match{Ref: f.layer.String()}
	release := f.reg.Hold(m, 2)
	other := f.reg.Hold(registry.Match{Repo: "other"}, 0)
	defer other()
	// Held: a client with a deadline gives up.
	f.stalledGet(t, 300*time.Millisecond)
	// The second GET is held until release, which lets it continue in
	// full; releasing another rule does not.
	got := make(chan []byte, 1)
	go func() {
		_, _, body := f.get(t, nil, "/v2/app/blobs/"+f.layer.String())
		got <- body
	}()
	for f.reg.Stalled(m) < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	other()
	select {
	case <-got:
		t.Fatal("releasing another rule let the held GET continue")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	if body := <-got; (v1.Hash{Algorithm: "sha256", Hex: sha256Hex(body)}) != f.layer {
		t.Fatalf("released GET: %d bytes, not the layer", len(body))
	}
}

func TestStallForDuration(t *testing.T) {
	f := newFixture(t)
	f.reg.Stall(registry.Match{Repo: "app"}, 1, 200*time.Millisecond)
	start := time.Now()
	code, _, body := f.get(t, nil, "/v2/app/blobs/"+f.layer.String())
	if code != http.StatusOK || int64(len(body)) < 256<<10 {
		t.Fatalf("GET = %d with %d bytes", code, len(body))
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("stalled transfer finished after %v, before the stall ended", d)
	}
}

func TestLatency(t *testing.T) {
	f := newFixture(t)
	f.reg.SetLatency(150 * time.Millisecond)
	start := time.Now()
	if code, _, _ := f.get(t, nil, "/v2/app/manifests/v1"); code != http.StatusOK {
		t.Fatalf("status = %d", code)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("response after %v, before the latency", d)
	}
}

func TestBandwidth(t *testing.T) {
	f := newFixture(t)
	const rate = 512 << 10 // 256 KiB takes at least ~0.5 s
	f.reg.SetBandwidth(rate)
	start := time.Now()
	code, _, body := f.get(t, nil, "/v2/app/blobs/"+f.layer.String())
	if code != http.StatusOK {
		t.Fatalf("status = %d", code)
	}
	// The first 16 KiB chunk goes out at once; the rest waits its turn.
	min := time.Duration(int64(len(body)-16<<10) * int64(time.Second) / rate)
	if d := time.Since(start); d < min {
		t.Fatalf("%d bytes in %v, faster than the cap allows (%v)", len(body), d, min)
	}
}

func TestCounters(t *testing.T) {
	f := newFixture(t)
	f.reg.Stall(registry.Match{Ref: f.layer.String()}, 0, 0)
	const n = 3
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One connection each.
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			code, _, body := f.get(t, client, "/v2/app/blobs/"+f.layer.String())
			if code != http.StatusOK || int64(len(body)) < 256<<10 {
				t.Errorf("GET = %d with %d bytes", code, len(body))
			}
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for f.reg.Stats().BlobTransfers < n {
		if time.Now().After(deadline) {
			t.Fatalf("never saw %d concurrent transfers: %+v", n, f.reg.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := f.reg.Stats()
	if s.Conns < n || s.PeakConns < n || s.PeakBlobTransfers != n {
		t.Fatalf("while stalled: %+v, want %d connections and transfers", s, n)
	}
	f.reg.ReleaseStalls()
	wg.Wait()
	// A transfer ends, and is logged, when its handler returns.
	waitLogged(t, f.reg, registry.Match{Kind: registry.Blobs}, n, "every blob GET")
	f.get(t, nil, "/v2/app/manifests/v1")
	s = f.reg.Stats()
	if s.BlobTransfers != 0 || s.PeakBlobTransfers != n {
		t.Fatalf("after the transfers: %+v, want 0 current and %d peak", s, n)
	}
	if s.Requests != n+1 {
		t.Fatalf("requests = %d, want %d", s.Requests, n+1)
	}
	if s.BytesSent < n*256<<10 {
		t.Fatalf("bytes sent = %d, want at least %d", s.BytesSent, n*256<<10)
	}
	blobs := f.reg.Requests(registry.Match{Kind: registry.Blobs})
	if len(blobs) != n {
		t.Fatalf("blob requests logged = %d, want %d", len(blobs), n)
	}
	f.reg.ResetStats()
	if s := f.reg.Stats(); s.Requests != 0 || s.BytesSent != 0 || len(f.reg.Requests(registry.Match{})) != 0 {
		t.Fatalf("after ResetStats: %+v", s)
	}
}

func TestRequestLogKeepsMirrorNamespace(t *testing.T) {
	f := newFixture(t)
	if code, _, _ := f.get(t, nil, "/v2/app/manifests/v1?ns=ghcr.io"); code != http.StatusOK {
		t.Fatalf("status = %d", code)
	}
	waitLogged(t, f.reg, registry.Match{Repo: "app", Kind: registry.Manifests}, 1, "the GET")
	reqs := f.reg.Requests(registry.Match{Repo: "app", Kind: registry.Manifests})
	if len(reqs) != 1 || reqs[0].NS != "ghcr.io" || reqs[0].Status != http.StatusOK || reqs[0].Method != http.MethodGet {
		t.Fatalf("logged %+v", reqs)
	}
}

// containerd resumes a cut-off blob download with an open-ended range;
// real registries serve it, so this one must too (and a range past the
// end is still refused).
func TestOpenEndedRange(t *testing.T) {
	f := newFixture(t)
	layers, err := f.img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(whole))
	for _, tc := range []struct {
		name       string
		header     string
		wantStatus int
		wantBody   []byte
	}{
		{"open-ended", "bytes=1000-", http.StatusPartialContent, whole[1000:]},
		{"closed", "bytes=10-19", http.StatusPartialContent, whole[10:20]},
		{"from zero", "bytes=0-", http.StatusPartialContent, whole},
		{"past the end", fmt.Sprintf("bytes=%d-", size), http.StatusRequestedRangeNotSatisfiable, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, "http://"+f.addr+"/v2/app/blobs/"+f.layer.String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Range", tc.header)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("Range %s: status %d, want %d (%s)", tc.header, resp.StatusCode, tc.wantStatus, body)
			}
			if tc.wantBody != nil && string(body) != string(tc.wantBody) {
				t.Errorf("Range %s: %d bytes, want %d", tc.header, len(body), len(tc.wantBody))
			}
		})
	}
}

func TestRedirectBlobsToAnExpiredObjectStore(t *testing.T) {
	f := newFixture(t)
	store := &registry.ExpiredObjectStore{}
	srv := &http.Server{Handler: store}
	l, err := newLoopbackListener()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	f.reg.RedirectBlobs(registry.Match{Repo: "app"}, "http://"+l.Addr().String(), 1)

	path := "/v2/app/blobs/" + f.layer.String()
	code, _, body := f.get(t, http.DefaultClient, path)
	if code != http.StatusForbidden || !strings.Contains(string(body), "AccessDenied") || store.Requests() != 1 {
		t.Fatalf("first GET: %d %q after %d object store requests, want the store's 403 AccessDenied", code, body, store.Requests())
	}
	// The redirect is for the first GET only: the next one gets the blob.
	if code, _, body := f.get(t, http.DefaultClient, path); code != http.StatusOK || len(body) < 256<<10 {
		t.Fatalf("second GET: %d, %d bytes", code, len(body))
	}
	// Manifests are never redirected.
	if code, _, _ := f.get(t, http.DefaultClient, "/v2/app/manifests/v1"); code != http.StatusOK {
		t.Fatalf("manifest GET: %d", code)
	}
}

func TestBaseChallengesOnlyWhileRepositoriesAreProtected(t *testing.T) {
	f := newFixture(t)
	if code, _, _ := f.get(t, http.DefaultClient, "/v2/"); code != http.StatusOK {
		t.Fatalf("/v2/ without protected repositories: %d, want 200", code)
	}
	f.reg.RequireAuth("private/*", "u", "p")
	code, h, _ := f.get(t, http.DefaultClient, "/v2/")
	if code != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic ") {
		t.Fatalf("/v2/ with a protected repository: %d %q, want 401 with a Basic challenge", code, h.Get("WWW-Authenticate"))
	}
	if code, _, _ := f.get(t, http.DefaultClient, "/v2/", "u", "p"); code != http.StatusOK {
		t.Fatalf("/v2/ with credentials: %d, want 200", code)
	}
	// Public repositories stay anonymous.
	if code, _, _ := f.get(t, http.DefaultClient, "/v2/app/manifests/v1"); code != http.StatusOK {
		t.Fatalf("public manifest: %d", code)
	}
}
