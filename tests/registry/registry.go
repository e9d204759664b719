// Package registry is an in-process OCI registry for tests, built on
// go-containerregistry's, with faults that can be switched on while it
// serves: error statuses for the first N requests, Basic-auth protected
// repositories, stalled blobs, latency and a bandwidth cap. It counts
// requests, bytes, connections and concurrent blob transfers so that tests
// can assert on what a client really did.
package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
)

// Kind selects manifest or blob requests.
type Kind int

const (
	// AnyKind matches manifests, blobs and everything else under /v2/.
	AnyKind Kind = iota
	Manifests
	Blobs
)

// Match selects requests. Empty fields match everything. Repo and Ref are
// path.Match patterns, so "team/*" matches every repository under team.
type Match struct {
	Repo string
	Kind Kind
	// Ref is a tag or digest (manifests) or a digest (blobs).
	Ref string
	// Method, if set, restricts the match to one HTTP method (GET, HEAD).
	Method string
}

func (m Match) matches(r route, method string) bool {
	if m.Method != "" && !strings.EqualFold(m.Method, method) {
		return false
	}
	if m.Kind == Manifests && r.kind != Manifests || m.Kind == Blobs && r.kind != Blobs {
		return false
	}
	if m.Repo != "" {
		if ok, _ := path.Match(m.Repo, r.repo); !ok {
			return false
		}
	}
	if m.Ref != "" {
		if ok, _ := path.Match(m.Ref, r.ref); !ok {
			return false
		}
	}
	return true
}

// route is a request path taken apart: /v2/<repo>/<manifests|blobs>/<ref>.
type route struct {
	repo string
	kind Kind
	ref  string
}

func parseRoute(p string) (route, bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return route{}, false
	}
	for _, k := range []struct {
		sep  string
		kind Kind
	}{{"/manifests/", Manifests}, {"/blobs/", Blobs}} {
		if i := strings.LastIndex(rest, k.sep); i > 0 {
			ref := rest[i+len(k.sep):]
			if k.kind == Blobs && strings.HasPrefix(ref, "uploads") {
				return route{repo: rest[:i], kind: AnyKind, ref: ref}, true
			}
			return route{repo: rest[:i], kind: k.kind, ref: ref}, true
		}
	}
	return route{}, false
}

type failRule struct {
	match  Match
	status int
	n      int
	seen   map[string]int // per request path
}

type stallRule struct {
	match Match
	n     int
	d     time.Duration
	// after is how many body bytes are sent before the stall.
	after int64
	seen  map[string]int
	// release, when set, lets this rule's stalls continue (Hold).
	release chan struct{}
}

type creds struct{ user, password string }

// Request is one request as the registry saw it.
type Request struct {
	Method string
	Path   string
	// NS is the ?ns= parameter containerd adds when it pulls through a
	// mirror: the registry host the image was asked for.
	NS     string
	Status int
	Bytes  int64
	// Range is the request's Range header, as the client sent it: a
	// client resuming a cut-off blob asks for its rest.
	Range string
}

// Stats are counters since the registry started or ResetStats.
type Stats struct {
	Requests          int64
	BytesSent         int64
	Conns             int64
	PeakConns         int64
	BlobTransfers     int64
	PeakBlobTransfers int64
}

// Registry is an http.Handler serving the OCI distribution API.
type Registry struct {
	inner http.Handler

	mu     sync.Mutex
	fails  []*failRule
	stalls []*stallRule
	// redirects send blob GETs elsewhere (redirect.go).
	redirects []*redirectRule
	auth      map[string]creds // repository pattern -> credentials
	latency   time.Duration
	limit     *limiter
	// throttles cap the blobs of some repositories on their own.
	throttles []*throttleRule
	log       []Request

	requests, bytesSent atomic.Int64
	conns, peakConns    atomic.Int64
	transfers, peakXfer atomic.Int64
	stallRelease        chan struct{}
}

// New returns an empty registry with no faults.
func New() *Registry {
	return &Registry{
		inner:        ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))),
		auth:         map[string]creds{},
		stallRelease: make(chan struct{}),
	}
}

// Fail answers the first n requests for each manifest or blob that m
// matches with status (404, 401, 429, 503, ...); later requests pass.
// Requests for a manifest by tag and by digest count together, since a
// client resolves the tag and then fetches by digest. n <= 0 fails every
// matching request.
func (r *Registry) Fail(m Match, status, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fails = append(r.fails, &failRule{match: m, status: status, n: n, seen: map[string]int{}})
}

// RequireAuth protects repositories matching repo with HTTP Basic auth:
// requests without these credentials get 401 with a Basic challenge, even
// for tags that do not exist (as real registries do).
func (r *Registry) RequireAuth(repo, user, password string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.auth[repo] = creds{user, password}
}

// Stall holds the body of the first n GETs of each blob that m matches
// (Kind is forced to Blobs): the headers are sent, then nothing until d has
// passed (d <= 0: until the client gives up or ReleaseStalls is called).
func (r *Registry) Stall(m Match, n int, d time.Duration) {
	r.StallAfter(m, n, 0, d)
}

// StallAfter is Stall, with the stall after the first after bytes of the
// body: a transfer cut off mid-blob, for testing whether a client resumes
// it or starts over.
func (r *Registry) StallAfter(m Match, n int, after int64, d time.Duration) {
	m.Kind = Blobs
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stalls = append(r.stalls, &stallRule{match: m, n: n, d: d, after: after, seen: map[string]int{}})
}

// Hold is Stall until the returned release is called (or the client gives
// up): it lets only this rule's transfers continue, not those of tests
// running side by side.
func (r *Registry) Hold(m Match, n int) (release func()) {
	m.Kind = Blobs
	ch := make(chan struct{})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stalls = append(r.stalls, &stallRule{match: m, n: n, seen: map[string]int{}, release: ch})
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// ReleaseStalls lets every stalled transfer continue.
func (r *Registry) ReleaseStalls() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.stallRelease)
	r.stallRelease = make(chan struct{})
}

// SetLatency delays every response by d.
func (r *Registry) SetLatency(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latency = d
}

// SetBandwidth caps the bytes per second of all response bodies together;
// 0 removes the cap.
func (r *Registry) SetBandwidth(bytesPerSecond int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if bytesPerSecond <= 0 {
		r.limit = nil
		return
	}
	r.limit = &limiter{rate: bytesPerSecond}
}

// Throttle caps the bytes per second of the blob GETs m matches (Kind is
// forced to Blobs), all of them together, instead of the cap SetBandwidth
// sets: a slow registry for some repositories only, so that tests running
// side by side do not slow each other down.
func (r *Registry) Throttle(m Match, bytesPerSecond int64) {
	m.Kind = Blobs
	r.mu.Lock()
	defer r.mu.Unlock()
	r.throttles = append(r.throttles, &throttleRule{match: m, limit: &limiter{rate: bytesPerSecond}})
}

type throttleRule struct {
	match Match
	limit *limiter
}

// ClearFaults removes every fault (failures, auth, stalls, latency, cap)
// and releases stalled transfers. Counters are kept.
func (r *Registry) ClearFaults() {
	r.mu.Lock()
	r.fails, r.stalls, r.auth, r.latency, r.limit, r.throttles = nil, nil, map[string]creds{}, 0, nil, nil
	r.redirects = nil
	r.mu.Unlock()
	r.ReleaseStalls()
}

// Stats returns the counters.
func (r *Registry) Stats() Stats {
	return Stats{
		Requests:          r.requests.Load(),
		BytesSent:         r.bytesSent.Load(),
		Conns:             r.conns.Load(),
		PeakConns:         r.peakConns.Load(),
		BlobTransfers:     r.transfers.Load(),
		PeakBlobTransfers: r.peakXfer.Load(),
	}
}

// ResetStats zeroes the counters and the request log; the peaks restart
// from the current values.
func (r *Registry) ResetStats() {
	r.requests.Store(0)
	r.bytesSent.Store(0)
	r.peakConns.Store(r.conns.Load())
	r.peakXfer.Store(r.transfers.Load())
	r.mu.Lock()
	r.log = nil
	r.mu.Unlock()
}

// Requests returns the requests seen so far that m matches.
func (r *Registry) Requests(m Match) []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Request
	for _, q := range r.log {
		rt, ok := parseRoute(q.Path)
		if !ok {
			rt = route{}
		}
		if m == (Match{}) || ok && m.matches(rt, q.Method) {
			out = append(out, q)
		}
	}
	return out
}

// ConnState counts connections; Serve installs it, and an httptest.Server
// can too.
func (r *Registry) ConnState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		peak(&r.peakConns, r.conns.Add(1))
	case http.StateClosed, http.StateHijacked:
		r.conns.Add(-1)
	}
}

// Serve serves on l until stop is called; stop closes every connection.
func (r *Registry) Serve(l net.Listener) (stop func()) {
	srv := &http.Server{Handler: r, ConnState: r.ConnState, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return func() {
		// Clients of a test registry need no graceful goodbye, and a
		// stalled transfer would hold a graceful shutdown up.
		r.ReleaseStalls()
		_ = srv.Close()
	}
}

// Listen serves on addr ("127.0.0.1:0" picks a port) and returns the
// address it got.
func (r *Registry) Listen(addr string) (string, func(), error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("registry listen: %w", err)
	}
	return l.Addr().String(), r.Serve(l), nil
}

func peak(p *atomic.Int64, v int64) {
	for {
		cur := p.Load()
		if v <= cur || p.CompareAndSwap(cur, v) {
			return
		}
	}
}

// ServeHTTP applies the faults, then the real registry.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.requests.Add(1)
	rangeHeader := req.Header.Get("Range")
	cw := &countingWriter{ResponseWriter: w, r: r, status: http.StatusOK}
	defer func() {
		r.mu.Lock()
		r.log = append(r.log, Request{Method: req.Method, Path: req.URL.Path, NS: req.URL.Query().Get("ns"), Status: cw.status, Bytes: cw.n, Range: rangeHeader})
		r.mu.Unlock()
	}()

	if r.challengeBase(cw, req) {
		return
	}
	rt, isRoute := parseRoute(req.URL.Path)
	key := req.URL.Path
	if isRoute {
		key = r.objectKey(rt)
	}
	r.mu.Lock()
	latency, limit := r.latency, r.limit
	var authFor *creds
	var failStatus int
	var stallFor *stallRule
	release := r.stallRelease
	if isRoute {
		for pattern, c := range r.auth {
			if ok, _ := path.Match(pattern, rt.repo); ok {
				c := c
				authFor = &c
				break
			}
		}
		for _, f := range r.fails {
			if f.match.matches(rt, req.Method) {
				f.seen[key]++
				if f.n <= 0 || f.seen[key] <= f.n {
					failStatus = f.status
					break
				}
			}
		}
		if req.Method == http.MethodGet && rt.kind == Blobs {
			for _, th := range r.throttles {
				if th.match.matches(rt, req.Method) {
					limit = th.limit
					break
				}
			}
			for _, s := range r.stalls {
				if s.match.matches(rt, req.Method) {
					s.seen[key]++
					if s.n <= 0 || s.seen[key] <= s.n {
						stallFor = s
						break
					}
				}
			}
		}
	}
	r.mu.Unlock()

	if latency > 0 {
		select {
		case <-time.After(latency):
		case <-req.Context().Done():
			return
		}
	}
	if authFor != nil {
		u, p, ok := req.BasicAuth()
		if !ok || u != authFor.user || p != authFor.password {
			w.Header().Set("WWW-Authenticate", `Basic realm="image-prefetcher-e2e"`)
			writeError(cw, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		}
	}
	if failStatus != 0 {
		writeError(cw, failStatus, codeFor(failStatus, rt.kind), "injected fault")
		return
	}
	if isRoute {
		if loc := r.redirect(rt, req); loc != "" {
			http.Redirect(cw, req, loc, http.StatusTemporaryRedirect)
			return
		}
	}
	if req.Method == http.MethodGet && rt.kind == Blobs {
		peak(&r.peakXfer, r.transfers.Add(1))
		defer r.transfers.Add(-1)
		cw.limit = limit
		cw.ctx = req.Context()
		if stallFor != nil {
			cw.stallAt = stallFor.after
			cw.stall = func() {
				if f, ok := w.(http.Flusher); ok {
					f.Flush()
				}
				var timer <-chan time.Time
				if stallFor.d > 0 {
					timer = time.After(stallFor.d)
				}
				select {
				case <-timer:
				case <-release:
				case <-stallFor.release:
				case <-req.Context().Done():
				}
			}
		}
	} else {
		cw.limit = limit
		cw.ctx = req.Context()
	}
	if req.Method == http.MethodGet && rt.kind == Blobs {
		r.closeRange(req, rt)
	}
	r.inner.ServeHTTP(cw, req)
}

// closeRange turns an open-ended Range ("bytes=N-"), which go-containerregistry's
// registry answers with 416, into the closed range it understands. Real
// registries serve open ranges, and containerd sends one when it resumes
// a blob whose download was cut off (for example by a containerd restart):
// without this, every later pull of that blob would fail.
func (r *Registry) closeRange(req *http.Request, rt route) {
	var start int64
	h := req.Header.Get("Range")
	if h == "" || !strings.HasSuffix(h, "-") {
		return
	}
	if _, err := fmt.Sscanf(h, "bytes=%d-", &start); err != nil {
		return
	}
	head := httptest.NewRequest(http.MethodHead, "/v2/"+rt.repo+"/blobs/"+rt.ref, nil)
	rec := httptest.NewRecorder()
	r.inner.ServeHTTP(rec, head)
	var size int64
	if _, err := fmt.Sscanf(rec.Header().Get("Content-Length"), "%d", &size); rec.Code != http.StatusOK || err != nil || start >= size {
		return // the registry answers as it would have: 404, or 416 for a range past the end
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, size-1))
}

// objectKey names what a request is for: repository and digest, looking a
// tag up in the registry itself so that tag and digest requests of one
// manifest share a key. An unknown tag keys by the tag.
func (r *Registry) objectKey(rt route) string {
	if rt.kind != Manifests || strings.HasPrefix(rt.ref, "sha256:") {
		return rt.repo + "@" + rt.ref
	}
	req := httptest.NewRequest(http.MethodHead, "/v2/"+rt.repo+"/manifests/"+rt.ref, nil)
	req.Header.Set("Accept", strings.Join(manifestTypes, ","))
	rec := httptest.NewRecorder()
	r.inner.ServeHTTP(rec, req)
	if d := rec.Header().Get("Docker-Content-Digest"); rec.Code == http.StatusOK && d != "" {
		return rt.repo + "@" + d
	}
	return rt.repo + ":" + rt.ref
}

var manifestTypes = []string{
	"application/vnd.oci.image.index.v1+json",
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.list.v2+json",
	"application/vnd.docker.distribution.manifest.v2+json",
}

func codeFor(status int, kind Kind) string {
	switch status {
	case http.StatusNotFound:
		if kind == Blobs {
			return "BLOB_UNKNOWN"
		}
		return "MANIFEST_UNKNOWN"
	case http.StatusUnauthorized:
		return "UNAUTHORIZED"
	case http.StatusForbidden:
		return "DENIED"
	case http.StatusTooManyRequests:
		return "TOOMANYREQUESTS"
	default:
		return "UNAVAILABLE"
	}
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`, code, msg)
}

// countingWriter counts body bytes and applies the stall and the cap.
type countingWriter struct {
	http.ResponseWriter
	r      *Registry
	status int
	n      int64
	limit  *limiter
	ctx    context.Context
	stall  func()
	// stallAt is the body offset at which stall runs.
	stallAt int64
}

func (c *countingWriter) WriteHeader(status int) {
	c.status = status
	c.ResponseWriter.WriteHeader(status)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if c.stall != nil && c.n >= c.stallAt {
			s := c.stall
			c.stall = nil
			s()
			if c.ctx.Err() != nil {
				return written, c.ctx.Err()
			}
		}
		chunk := p
		if c.limit != nil && len(chunk) > 16<<10 {
			chunk = chunk[:16<<10]
		}
		if c.stall != nil && c.n+int64(len(chunk)) > c.stallAt {
			chunk = chunk[:c.stallAt-c.n]
		}
		if c.limit != nil {
			if err := c.limit.wait(c.ctx, len(chunk)); err != nil {
				return written, err
			}
		}
		n, err := c.ResponseWriter.Write(chunk)
		written += n
		c.n += int64(n)
		c.r.bytesSent.Add(int64(n))
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// limiter spaces writes so that all of them together stay under rate.
type limiter struct {
	rate int64
	mu   sync.Mutex
	next time.Time
}

func (l *limiter) wait(ctx context.Context, n int) error {
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(time.Duration(int64(n) * int64(time.Second) / l.rate))
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errors.Join(ctx.Err(), context.Cause(ctx))
	}
}
