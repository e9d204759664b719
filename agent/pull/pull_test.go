package pull

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// memRuntime is an in-memory Runtime where every pull succeeds.
type memRuntime struct {
	mu      sync.Mutex
	present map[string]bool
	pulls   map[string]int
}

func (m *memRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	ref = containerdRef(ref)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.present[ref] {
		return &cri.ImageInfo{ID: ref, Size: 10}, nil
	}
	return nil, nil
}

func (m *memRuntime) PullImage(_ context.Context, ref string, _ *cri.Auth) (string, error) {
	ref = containerdRef(ref)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pulls[ref]++
	m.present[ref] = true
	return ref, nil
}

// containerdRef qualifies a reference as containerd's CRI does with what
// the agent sends ("a:1" is docker.io/library/a:1).
func containerdRef(ref string) string {
	if n, err := imagelist.Normalize(ref); err == nil {
		return n
	}
	return ref
}

type countingGate struct{ acquired, released int }

func (g *countingGate) Hold(context.Context) (Slot, error) {
	g.acquired++
	return countedSlot{g}, nil
}

type countedSlot struct{ g *countingGate }

func (s countedSlot) Release()            { s.g.released++ }
func (countedSlot) Lost() <-chan struct{} { return nil }

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

// Which present image each policy pulls again, and whether that takes a
// herd-control slot. Under herd control the Kubelet policy's :latest is
// pulled only when missing, so that a node with every image present
// takes no slot (finding 6 of issue 27).
func TestPolicies(t *testing.T) {
	digest := "a@sha256:" + "0123456789012345678901234567890123456789012345678901234567890123"
	cases := []struct {
		policy v1alpha1.PullPolicy
		ref    string
		gate   bool
		pulls  int
	}{
		{v1alpha1.PullKubelet, "a:1", false, 0},
		{v1alpha1.PullKubelet, "a:latest", false, 1},
		{v1alpha1.PullKubelet, "a", false, 1},
		{v1alpha1.PullKubelet, digest, false, 0},
		{v1alpha1.PullIfNotPresent, "a:latest", false, 0},
		{v1alpha1.PullAlways, "a:1", false, 1},
		{v1alpha1.PullKubelet, "a:1", true, 0},
		{v1alpha1.PullKubelet, "a:latest", true, 0},
		{v1alpha1.PullKubelet, "a", true, 0},
		{v1alpha1.PullAlways, "a:1", true, 1},
	}
	for _, c := range cases {
		e := entries(c.ref)[0]
		rt := &memRuntime{present: map[string]bool{e.Normalized: true}, pulls: map[string]int{}}
		cfg := Config{Policy: c.policy, Creds: noCreds{}}
		g := &countingGate{}
		if c.gate {
			cfg.Gate = g
		}
		New(rt, cfg).Run(context.Background(), []imagelist.Entry{e}, "")
		if rt.pulls[e.Normalized] != c.pulls {
			t.Errorf("%s %s, herd control %v: %d pulls, want %d", c.policy, c.ref, c.gate, rt.pulls[e.Normalized], c.pulls)
		}
		if c.gate && g.acquired != c.pulls {
			t.Errorf("%s %s: %d slots taken for %d pulls", c.policy, c.ref, g.acquired, c.pulls)
		}
	}
}

func TestParallelismBound(t *testing.T) {
	cases := []struct {
		name        string
		parallelism int
		images      []string
		// failFirst is how many 503s an image gets before it succeeds. The
		// first parallelism images must fail at least once for the run to
		// have an image in backoff while the slots are full.
		failFirst map[string]int
	}{
		{"all healthy", 2, []string{"a:1", "b:1", "c:1", "d:1", "e:1"}, nil},
		{"retries in backoff", 2, []string{"a:1", "b:1", "c:1", "d:1", "e:1"}, map[string]int{"a:1": 2, "b:1": 1}},
		{"one slot", 1, []string{"a:1", "b:1", "c:1"}, map[string]int{"a:1": 3}},
		{"three slots", 3, []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1"}, map[string]int{"a:1": 1, "b:1": 2, "c:1": 1, "e:1": 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := entries(c.images...)
			fail := map[string]int{}
			total := len(e)
			for _, x := range e {
				fail[x.Normalized] = c.failFirst[x.Ref]
				total += c.failFirst[x.Ref]
			}
			rt := newScriptRuntime(func(ref string, n int) error {
				if n <= fail[ref] {
					return fakecri.HTTPStatus(ref, "docker.io", "503 Service Unavailable")
				}
				return nil
			})
			rt.release = make(chan struct{})
			rt.arrived = make(chan string, total)
			p := New(rt, Config{Parallelism: c.parallelism, Creds: noCreds{}, Log: discard, OverallTimeout: guard,
				Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
			done := make(chan []Result, 1)
			go func() { done <- p.Run(context.Background(), e, "") }()
			next := func() {
				t.Helper()
				select {
				case <-rt.arrived:
				case res := <-done:
					t.Fatalf("run ended while a call was expected: %+v", res)
				}
			}
			// Fill every slot and let one call finish: the first
			// parallelism images all fail first, so it fails. Nothing else
			// is released until the next call starts, so that call is
			// recorded with every slot busy.
			for range c.parallelism {
				next()
			}
			rt.release <- struct{}{}
			next()
			// Then let the rest through in any order.
			var res []Result
			for res == nil {
				select {
				case rt.release <- struct{}{}:
				case res = <-done:
				}
			}
			for _, r := range res {
				if !r.Present || r.Attempts != fail[r.Normalized]+1 {
					t.Errorf("%+v, want present after %d attempts", r, fail[r.Normalized]+1)
				}
			}
			var busyWhileWaiting bool
			for _, a := range rt.arrivalsSnapshot() {
				if a.active > c.parallelism {
					t.Errorf("%d calls in flight when %s started, want at most %d", a.active, a.image, c.parallelism)
				}
				if a.active == c.parallelism && a.waiting > 0 {
					busyWhileWaiting = true
				}
			}
			// A slot freed by an image in backoff must go to another image.
			if len(c.failFirst) > 0 && !busyWhileWaiting {
				t.Errorf("no call started while %d slot(s) were busy and an image waited for its retry: %+v", c.parallelism, rt.arrivalsSnapshot())
			}
		})
	}
}

func TestOverallTimeoutEndsTheRun(t *testing.T) {
	untilDone := func(ctx context.Context, _ time.Duration) error { <-ctx.Done(); return ctx.Err() }
	cases := []struct {
		name    string
		rt      Runtime
		images  []string
		message []string // per image, a part of the message
		calls   []int    // per image, PullImage calls reaching the runtime; -1: not counted
	}{
		{"transient retries", failing{}, []string{"a:1"},
			[]string{"gave up after 1 attempts when the overall timeout ran out"}, []int{-1}},
		// The stalled pull holds the only slot until the overall timeout, so
		// the second image is never sent to the runtime.
		{"queued image", newScriptRuntime(func(ref string, _ int) error {
			if ref == "docker.io/library/stall:1" {
				return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
			}
			return nil
		}), []string{"stall:1", "queued:1"},
			[]string{"gave up after 1 attempts", "not attempted: the overall timeout ran out while it waited for a pull slot"}, []int{1, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if sr, ok := c.rt.(*scriptRuntime); ok {
				// Hold the stalled call until its context ends.
				sr.release = make(chan struct{})
			}
			p := New(c.rt, Config{Creds: noCreds{}, Log: discard, OverallTimeout: 50 * time.Millisecond, Sleep: untilDone})
			res := p.Run(context.Background(), entries(c.images...), "")
			for i, r := range res {
				if r.Present || r.Reason != ReasonTimeout || !strings.Contains(r.Message, c.message[i]) {
					t.Errorf("%+v, want Timeout with %q", r, c.message[i])
				}
				if sr, ok := c.rt.(*scriptRuntime); ok && c.calls[i] >= 0 {
					if n := sr.callsFor(r.Normalized); n != c.calls[i] || r.Attempts != c.calls[i] {
						t.Errorf("%s: %d calls, %d attempts, want %d", r.Image, n, r.Attempts, c.calls[i])
					}
				}
			}
		})
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
	ref = containerdRef(ref)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.present[ref] {
		return &cri.ImageInfo{ID: ref, Size: 10}, nil
	}
	return nil, nil
}

func (m *scriptRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	ref = containerdRef(ref)
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

func (m *scriptRuntime) arrivalsSnapshot() []arrival {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]arrival(nil), m.arrivals...)
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

// Images on a failing registry must not keep the others from the runtime:
// a slot is only held while a call is in flight, and an image whose delay
// is over queues behind the images already waiting.
func TestFailingImagesDoNotStarveOthers(t *testing.T) {
	// The backoff outlasts the run: the image waits until the run ends.
	untilDone := func(ctx context.Context, _ time.Duration) error { <-ctx.Done(); return ctx.Err() }
	// The backoff is over at once: the image competes for a slot again.
	instant := func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	const (
		down  = "down"  // always 503
		flaky = "flaky" // 503 once, then fine
	)
	type want struct {
		present bool
		// calls is the exact number of PullImage calls; 0 means at least one.
		calls int
	}
	cases := []struct {
		name        string
		parallelism int
		sleep       func(context.Context, time.Duration) error
		images      []string
		behavior    map[string]string
		// hold keeps the first call of every down image in the runtime
		// until this many of them are in flight, so that the slots are
		// all taken by the failing registry before any image moves on.
		hold int
		want map[string]want
	}{
		{"backoff outlasts the run", 1, untilDone, []string{"bad:1", "good:1"},
			map[string]string{"bad:1": down}, 0,
			map[string]want{"bad:1": {false, 1}, "good:1": {true, 1}}},
		{"every slot on a failing registry", 2, untilDone, []string{"bad:1", "bad:2", "good:1"},
			map[string]string{"bad:1": down, "bad:2": down}, 2,
			map[string]want{"bad:1": {false, 1}, "bad:2": {false, 1}, "good:1": {true, 1}}},
		{"instant retries do not monopolise the slot", 1, instant, []string{"bad:1", "good:1"},
			map[string]string{"bad:1": down}, 0,
			map[string]want{"bad:1": {false, 0}, "good:1": {true, 1}}},
		// Two images retrying at once must not take turns forever ahead of
		// a third whose delay is over.
		{"a retry is not overtaken forever", 1, instant, []string{"flaky:1", "bad:1", "bad:2"},
			map[string]string{"flaky:1": flaky, "bad:1": down, "bad:2": down}, 0,
			map[string]want{"flaky:1": {true, 2}, "bad:1": {false, 0}, "bad:2": {false, 0}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := entries(c.images...)
			behavior := map[string]string{}
			waitFor := map[string]bool{}
			for _, x := range e {
				behavior[x.Normalized] = c.behavior[x.Ref]
				if c.want[x.Ref].present {
					waitFor[x.Normalized] = true
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var held sync.WaitGroup
			held.Add(c.hold)
			rt := newScriptRuntime(func(ref string, n int) error {
				switch behavior[ref] {
				case down:
					if c.hold > 0 && n == 1 {
						held.Done()
						held.Wait()
					}
					return fakecri.HTTPStatus(ref, "registry-1.docker.io", "503 Service Unavailable")
				case flaky:
					if n == 1 {
						return fakecri.HTTPStatus(ref, "registry-1.docker.io", "503 Service Unavailable")
					}
				}
				return nil
			})
			var mu sync.Mutex
			rt.pulled = func(ref string) {
				// Once the images that can be pulled are, only the failing
				// ones are left, and they would retry until the guard.
				mu.Lock()
				defer mu.Unlock()
				delete(waitFor, ref)
				if len(waitFor) == 0 {
					cancel()
				}
			}
			p := New(rt, Config{Parallelism: c.parallelism, Creds: noCreds{}, Log: discard, OverallTimeout: guard, Sleep: c.sleep})
			res := p.Run(ctx, e, "")
			for _, r := range res {
				w := c.want[r.Image]
				n := rt.callsFor(r.Normalized)
				switch {
				case n == 0:
					t.Errorf("%s: never sent to the runtime", r.Image)
				case w.calls > 0 && n != w.calls:
					t.Errorf("%s: %d PullImage calls, want %d", r.Image, n, w.calls)
				}
				if w.present {
					if !r.Present || !r.Pulled || r.Attempts != n {
						t.Errorf("%+v, want pulled, one attempt per call (%d calls)", r, n)
					}
					continue
				}
				if r.Present || r.Reason != ReasonTimeout || !strings.Contains(r.Message, "503 Service Unavailable") {
					t.Errorf("%+v, want Timeout after 503s", r)
				}
			}
		})
	}
}
