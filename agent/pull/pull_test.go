package pull

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
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
