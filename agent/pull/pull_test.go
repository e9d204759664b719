package pull

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// memRuntime is an in-memory Runtime.
type memRuntime struct {
	mu      sync.Mutex
	present map[string]bool
	pulls   map[string]int
	active  int32
	peak    int32
	block   chan struct{}
}

func (m *memRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.present[ref] {
		return &cri.ImageInfo{ID: ref, Size: 10}, nil
	}
	return nil, nil
}

func (m *memRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	n := atomic.AddInt32(&m.active, 1)
	defer atomic.AddInt32(&m.active, -1)
	for {
		p := atomic.LoadInt32(&m.peak)
		if n <= p || atomic.CompareAndSwapInt32(&m.peak, p, n) {
			break
		}
	}
	if m.block != nil {
		<-m.block
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pulls[ref]++
	m.present[ref] = true
	return ref, nil
}

type countingGate struct{ acquired, released int }

func (g *countingGate) Acquire(context.Context) (func(), error) {
	g.acquired++
	return func() { g.released++ }, nil
}

type noCreds struct{}

func (noCreds) Lookup(context.Context, string) []cri.Auth { return nil }

func entries(refs ...string) []imagelist.Entry {
	var b imagelist.Builder
	for _, r := range refs {
		b.Add(0, r)
	}
	return b.List().Entries
}

func TestGateIsTakenOnlyWhenSomethingNeedsPulling(t *testing.T) {
	rt := &memRuntime{present: map[string]bool{"docker.io/library/a:1": true, "docker.io/library/b:2": true}, pulls: map[string]int{}}
	g := &countingGate{}
	p := New(rt, Config{Gate: g, Creds: noCreds{}})
	res := p.Run(context.Background(), entries("a:1", "b:2"), "")
	if g.acquired != 0 {
		t.Errorf("gate acquired %d times with everything present", g.acquired)
	}
	for _, r := range res {
		if !r.Present || r.Pulled {
			t.Errorf("%+v", r)
		}
	}
	p.Run(context.Background(), entries("a:1", "c:3", "d:4"), "")
	if g.acquired != 1 || g.released != 1 {
		t.Errorf("acquired %d released %d, want 1 and 1", g.acquired, g.released)
	}
}

func TestPolicies(t *testing.T) {
	cases := []struct {
		policy v1alpha1.PullPolicy
		ref    string
		pulls  int
	}{
		{v1alpha1.PullKubelet, "a:1", 0},
		{v1alpha1.PullKubelet, "a:latest", 1},
		{v1alpha1.PullKubelet, "a", 1},
		{v1alpha1.PullKubelet, "a@sha256:" + "0123456789012345678901234567890123456789012345678901234567890123", 0},
		{v1alpha1.PullIfNotPresent, "a:latest", 0},
		{v1alpha1.PullAlways, "a:1", 1},
	}
	for _, c := range cases {
		e := entries(c.ref)[0]
		rt := &memRuntime{present: map[string]bool{e.Normalized: true}, pulls: map[string]int{}}
		New(rt, Config{Policy: c.policy, Creds: noCreds{}}).Run(context.Background(), []imagelist.Entry{e}, "")
		if rt.pulls[e.Normalized] != c.pulls {
			t.Errorf("%s %s: %d pulls, want %d", c.policy, c.ref, rt.pulls[e.Normalized], c.pulls)
		}
	}
}

func TestParallelismBound(t *testing.T) {
	rt := &memRuntime{present: map[string]bool{}, pulls: map[string]int{}, block: make(chan struct{})}
	p := New(rt, Config{Parallelism: 2, Creds: noCreds{}})
	done := make(chan []Result)
	go func() { done <- p.Run(context.Background(), entries("a:1", "b:1", "c:1", "d:1", "e:1"), "") }()
	// Let pulls through one by one; never more than two run at once.
	for range 5 {
		rt.block <- struct{}{}
	}
	res := <-done
	if peak := atomic.LoadInt32(&rt.peak); peak > 2 || peak < 1 {
		t.Errorf("peak concurrency %d, want at most 2", peak)
	}
	for _, r := range res {
		if !r.Present {
			t.Errorf("%+v", r)
		}
	}
}

func TestOverallTimeoutEndsTransientRetries(t *testing.T) {
	rt := &failing{}
	p := New(rt, Config{Creds: noCreds{}, OverallTimeout: 50 * time.Millisecond,
		Sleep: func(ctx context.Context, _ time.Duration) error { <-ctx.Done(); return ctx.Err() }})
	res := p.Run(context.Background(), entries("a:1"), "")
	if res[0].Present || res[0].Reason != ReasonTimeout {
		t.Errorf("%+v", res[0])
	}
}

type failing struct{}

func (failing) ImageStatus(context.Context, string) (*cri.ImageInfo, error) { return nil, nil }
func (failing) PullImage(context.Context, string, *cri.Auth) (string, error) {
	return "", context.DeadlineExceeded
}

// guard is the overall timeout of tests that must finish through their own
// logic: a regression then fails at the guard instead of hanging, and the
// correct code never comes near it. No test asserts on elapsed time.
const guard = 5 * time.Second

var discard = slog.New(slog.DiscardHandler)

// scriptRuntime answers PullImage from a script and records every call.
type scriptRuntime struct {
	// script decides the n-th (1-based) call for ref; nil means success.
	script func(ref string, n int) error
	// release, when set, holds every call until the test sends a token.
	release chan struct{}
	// arrived, when set, gets each call's image as the call starts.
	arrived chan string
	// pulled, when set, is called after each successful pull.
	pulled func(ref string)

	mu       sync.Mutex
	present  map[string]bool
	calls    map[string]int
	failed   map[string]bool // images whose latest call failed
	active   int
	arrivals []arrival
}

// arrival is the runtime's view when a PullImage call starts.
type arrival struct {
	image string
	// active counts the calls in flight, this one included.
	active int
	// waiting counts the images whose latest call failed and that have no
	// call in flight: they are in backoff or queued for their retry.
	waiting int
}

func newScriptRuntime(script func(ref string, n int) error) *scriptRuntime {
	return &scriptRuntime{script: script, present: map[string]bool{}, calls: map[string]int{}, failed: map[string]bool{}}
}

func (m *scriptRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.present[ref] {
		return &cri.ImageInfo{ID: ref, Size: 10}, nil
	}
	return nil, nil
}

func (m *scriptRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	// grpc fails a call whose context has ended without sending it, so
	// such a call never reaches the runtime.
	if err := ctx.Err(); err != nil {
		return "", err
	}
	m.mu.Lock()
	m.calls[ref]++
	n := m.calls[ref]
	delete(m.failed, ref)
	m.active++
	m.arrivals = append(m.arrivals, arrival{image: ref, active: m.active, waiting: len(m.failed)})
	m.mu.Unlock()
	if m.arrived != nil {
		m.arrived <- ref
	}
	var err error
	if m.release != nil {
		select {
		case <-m.release:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err == nil && m.script != nil {
		err = m.script(ref, n)
	}
	m.mu.Lock()
	m.active--
	if err != nil {
		m.failed[ref] = true
	} else {
		m.present[ref] = true
	}
	m.mu.Unlock()
	if err == nil && m.pulled != nil {
		m.pulled(ref)
	}
	return ref, err
}

func (m *scriptRuntime) callsFor(ref string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[ref]
}

func TestPermanentErrorsGiveUpAfterThreeAttempts(t *testing.T) {
	cases := []struct {
		name    string
		ref     string // as listed
		err     func(normalized string) error
		reason  string
		message string
	}{
		{"missing tag", "app:1", fakecri.NotFound, ReasonNotFound, "not found"},
		{"401", "registry.example.com/team/app:1", func(r string) error { return fakecri.HTTPStatus(r, "registry.example.com", "401 Unauthorized") }, ReasonUnauthorized, "401 Unauthorized"},
		{"403", "registry.example.com/team/app:1", func(r string) error { return fakecri.HTTPStatus(r, "registry.example.com", "403 Forbidden") }, ReasonForbidden, "403 Forbidden"},
		// Docker Hub answers a typo in the repository name like this; it
		// used to be retried until the overall timeout.
		{"docker hub typo", "no-such-repo:1", fakecri.PullAccessDenied, ReasonUnauthorized, "pull access denied, repository does not exist or may require authorization"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := entries(c.ref, "good:1")
			bad := e[0].Normalized
			rt := newScriptRuntime(func(ref string, _ int) error {
				if ref == bad {
					return c.err(ref)
				}
				return nil
			})
			var sleeps atomic.Int32
			p := New(rt, Config{Creds: noCreds{}, Log: discard, OverallTimeout: guard,
				Sleep: func(ctx context.Context, _ time.Duration) error { sleeps.Add(1); return ctx.Err() }})
			res := p.Run(context.Background(), e, "")
			r := res[0]
			if r.Present || r.Attempts != 3 || r.Reason != c.reason || !strings.Contains(r.Message, c.message) {
				t.Errorf("got %+v, want 3 attempts, reason %s, message with %q", r, c.reason, c.message)
			}
			if n := rt.callsFor(bad); n != 3 {
				t.Errorf("%d PullImage calls, want 3", n)
			}
			if n := sleeps.Load(); n != 2 {
				t.Errorf("%d delays, want 2 (between the 3 attempts)", n)
			}
			if !res[1].Present || !res[1].Pulled {
				t.Errorf("the other image: %+v", res[1])
			}
		})
	}
}
