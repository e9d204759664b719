package pull

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

// flakyStatusRuntime holds every image; its first ImageStatus call per
// image fails (a containerd restart, a slow runtime), and every pull fails
// as a registry that cannot be reached does.
type flakyStatusRuntime struct {
	mu       sync.Mutex
	statuses map[string]int
	pulls    int
}

func (m *flakyStatusRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.statuses[ref]++
	if m.statuses[ref] == 1 {
		return nil, status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: connection refused\"")
	}
	return &cri.ImageInfo{ID: ref, Size: 7}, nil
}

func (m *flakyStatusRuntime) PullImage(_ context.Context, ref string, _ *cri.Auth) (string, error) {
	m.mu.Lock()
	m.pulls++
	m.mu.Unlock()
	return "", fakecri.ConnectionRefused(ref, "10.0.0.1:443")
}

// One failed ImageStatus call must not turn a present image into a
// failure: a pull that fails is followed by another look, and an image
// that is there counts as present.
func TestStatusErrorDoesNotFailAPresentImage(t *testing.T) {
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprintf("permanent=%v", permanent), func(t *testing.T) {
			rt := &flakyStatusRuntime{statuses: map[string]int{}}
			var r Runtime = rt
			if permanent {
				r = notFoundPulls{rt}
			}
			p := New(r, Config{Creds: noCreds{}, Log: discard, OverallTimeout: guard,
				Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
			res := p.Run(context.Background(), entries("a:1", "b:2"), "")
			for _, r := range res {
				if !r.Present || r.Pulled || r.Reason != "" || r.Bytes != 7 {
					t.Errorf("%+v, want present (not pulled), size 7", r)
				}
			}
		})
	}
}

type notFoundPulls struct{ *flakyStatusRuntime }

func (n notFoundPulls) PullImage(ctx context.Context, ref string, a *cri.Auth) (string, error) {
	_, _ = n.flakyStatusRuntime.PullImage(ctx, ref, a)
	return "", fakecri.NotFound(ref)
}

// blockingStatusRuntime holds ImageStatus calls until released, and counts
// how many were waiting at once.
type blockingStatusRuntime struct {
	mu        sync.Mutex
	active    int
	maxActive int
	release   chan struct{}
}

func (m *blockingStatusRuntime) ImageStatus(ctx context.Context, ref string) (*cri.ImageInfo, error) {
	m.mu.Lock()
	m.active++
	m.maxActive = max(m.maxActive, m.active)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.active--
		m.mu.Unlock()
	}()
	select {
	case <-m.release:
		return &cri.ImageInfo{ID: ref}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (m *blockingStatusRuntime) PullImage(context.Context, string, *cri.Auth) (string, error) {
	return "", errors.New("unexpected pull")
}

func (m *blockingStatusRuntime) max() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxActive
}

// The ImageStatus pass asks for several images at once, up to a bound, so
// that a stuck runtime costs one call's timeout per batch, not per image.
func TestStatusPassIsParallelAndBounded(t *testing.T) {
	const images = 3 * StatusParallelism
	rt := &blockingStatusRuntime{release: make(chan struct{})}
	refs := make([]string, images)
	for i := range refs {
		refs[i] = fmt.Sprintf("img%d:1", i)
	}
	p := New(rt, Config{Creds: noCreds{}, Log: discard})
	done := make(chan []Result, 1)
	go func() { done <- p.Run(context.Background(), entries(refs...), "") }()
	deadline := time.Now().Add(time.Minute)
	for rt.max() < StatusParallelism {
		if time.Now().After(deadline) {
			t.Fatalf("at most %d ImageStatus calls at once, want %d", rt.max(), StatusParallelism)
		}
		time.Sleep(time.Millisecond)
	}
	close(rt.release)
	for _, r := range <-done {
		if !r.Present {
			t.Errorf("%+v", r)
		}
	}
	if m := rt.max(); m != StatusParallelism {
		t.Errorf("%d ImageStatus calls at once, want the bound %d", m, StatusParallelism)
	}
}
