package pull

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// clockRuntime records when things happen, on the monotonic clock, and the
// deadline each PullImage call gets. Images are absent until pulled.
type clockRuntime struct {
	// stall holds each PullImage call until its context ends.
	stall bool

	mu sync.Mutex
	// lastStatus is when the latest ImageStatus call before any PullImage
	// returned: the end of the pass that decides what to pull.
	lastStatus time.Time
	pulls      []pullSeen
}

type pullSeen struct {
	auth     *cri.Auth
	start    time.Time
	deadline time.Time
}

func (c *clockRuntime) ImageStatus(context.Context, string) (*cri.ImageInfo, error) {
	tick()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pulls) == 0 {
		c.lastStatus = time.Now()
	}
	return nil, nil
}

func (c *clockRuntime) PullImage(ctx context.Context, ref string, auth *cri.Auth) (string, error) {
	ref = containerdRef(ref)
	dl, _ := ctx.Deadline()
	c.mu.Lock()
	c.pulls = append(c.pulls, pullSeen{auth: auth, start: time.Now(), deadline: dl})
	c.mu.Unlock()
	if c.stall {
		<-ctx.Done()
		return "", status.FromContextError(ctx.Err()).Err()
	}
	return ref, nil
}

type fixedCreds []cri.Auth

func (f fixedCreds) Lookup(context.Context, string) []cri.Auth { return f }

// Each credential try, and the anonymous one, gets the attempt's whole
// timeout rather than a share of it: a try starts when the one before
// timed out, so its deadline is at least one timeout later.
func TestEachCredentialTryGetsTheAttemptTimeout(t *testing.T) {
	const timeout = 20 * time.Millisecond
	rt := &clockRuntime{stall: true}
	creds := fixedCreds{{Username: "a", ServerAddress: "https://registry.example.com"}, {Username: "b", ServerAddress: "https://registry.example.com"}}
	stop := errors.New("stop after the first attempt")
	p := New(rt, Config{InitialAttemptTimeout: timeout, MaxAttemptTimeout: timeout, OverallTimeout: guard, Creds: creds, Log: discard,
		Sleep: func(context.Context, time.Duration) error { return stop }})
	res := p.Run(context.Background(), entries("registry.example.com/app:1"), "")
	if res[0].Present || res[0].Attempts != 1 {
		t.Fatalf("%+v, want one failed attempt", res[0])
	}
	if len(rt.pulls) != 3 {
		t.Fatalf("%d PullImage calls in the attempt, want 3 (two credentials, then anonymous)", len(rt.pulls))
	}
	for i, want := range []string{"a", "b", ""} {
		got := rt.pulls[i]
		user := ""
		if got.auth != nil {
			user = got.auth.Username
		}
		if user != want {
			t.Errorf("try %d: user %q, want %q (\"\" is anonymous)", i, user, want)
		}
		if got.deadline.IsZero() {
			t.Fatalf("try %d had no deadline", i)
		}
		if i > 0 {
			if d := got.deadline.Sub(rt.pulls[i-1].deadline); d < timeout {
				t.Errorf("try %d: deadline %v after the previous try's, want at least the attempt timeout %v", i, d, timeout)
			}
		}
	}
}

// --overall-timeout starts once pulling starts: after the ImageStatus pass,
// and after the herd-control slot is taken, however long either took.
func TestOverallTimeoutStartsWhenPullingStarts(t *testing.T) {
	const overall = time.Hour
	tests := []struct {
		name string
		gate bool
	}{
		{"after the ImageStatus pass", false},
		{"after the slot is taken", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := &clockRuntime{}
			// The attempt timeout is longer, so the pull's deadline is the
			// overall one.
			cfg := Config{InitialAttemptTimeout: 2 * overall, MaxAttemptTimeout: 2 * overall, OverallTimeout: overall, Creds: noCreds{}, Log: discard}
			g := &clockGate{}
			if tt.gate {
				cfg.Gate = g
			}
			res := New(rt, cfg).Run(context.Background(), entries("a:1", "b:1"), "")
			for _, r := range res {
				if !r.Present {
					t.Fatalf("%+v", r)
				}
			}
			started := rt.lastStatus // when pulling may start
			if tt.gate {
				if !g.acquired.After(rt.lastStatus) {
					t.Fatalf("slot taken at %v, before the last ImageStatus at %v", g.acquired, rt.lastStatus)
				}
				started = g.acquired
			}
			for _, c := range rt.pulls {
				if c.deadline.Before(started.Add(overall)) || c.deadline.After(c.start.Add(overall)) {
					t.Errorf("pull deadline %v, want between %v and %v: the overall timeout from when pulling started",
						c.deadline, started.Add(overall), c.start.Add(overall))
				}
			}
		})
	}
}

// clockGate records when it handed out its slot.
type clockGate struct{ acquired time.Time }

func (g *clockGate) Hold(context.Context) (Slot, error) {
	tick()
	g.acquired = time.Now()
	return noSlot{}, nil
}

// tick waits for the monotonic clock to move on, so that a deadline set
// before the call is always earlier than one set after it.
func tick() {
	for t := time.Now(); !time.Now().After(t); {
	}
}
