package pull

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// slowRuntime is a runtime whose pulls take pullFor, and whose downloads
// grow from the start of the first pull until bytesFor has passed (then
// the registry stalls: the pull goes on, with no byte arriving).
type slowRuntime struct {
	pullFor, bytesFor time.Duration
	// downloadsErr is what Downloads returns, when set.
	downloadsErr error

	mu      sync.Mutex
	start   time.Time
	present bool
	pulls   int
	// deadline: the call had a deadline within a second (the overall timeout, guard, is further).
	deadline []bool
	errs     []error
}

func (s *slowRuntime) ImageStatus(context.Context, string) (*cri.ImageInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.present {
		return &cri.ImageInfo{ID: "x", Size: 1}, nil
	}
	return nil, nil
}

func (s *slowRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	// The run's overall timeout is a deadline too, far away.
	dl, ok := ctx.Deadline()
	s.mu.Lock()
	s.pulls++
	s.deadline = append(s.deadline, ok && time.Until(dl) < time.Second)
	if s.start.IsZero() {
		s.start = time.Now()
	}
	s.mu.Unlock()
	t := time.NewTimer(s.pullFor)
	defer t.Stop()
	select {
	case <-ctx.Done():
		err := status.FromContextError(ctx.Err()).Err()
		s.mu.Lock()
		s.errs = append(s.errs, err)
		s.mu.Unlock()
		return "", err
	case <-t.C:
	}
	s.mu.Lock()
	s.present = true
	s.mu.Unlock()
	return ref, nil
}

// Downloads reports one blob growing by a byte per millisecond while
// bytes arrive.
func (s *slowRuntime) Downloads(context.Context) (map[string]int64, error) {
	if s.downloadsErr != nil {
		return nil, s.downloadsErr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.start.IsZero() {
		return map[string]int64{}, nil
	}
	got := min(time.Since(s.start), s.bytesFor)
	return map[string]int64{"layer-sha256:aa": got.Milliseconds()}, nil
}

// The attempt timeout cuts a pull only when no bytes arrive at the
// runtime; without a progress source, or when the runtime cannot tell, it
// is the plain deadline it always was.
func TestAttemptTimeoutCountsFromTheLastByte(t *testing.T) {
	const timeout = 150 * time.Millisecond
	cases := []struct {
		name string
		rt   *slowRuntime
		// progress: the runtime is asked about its downloads.
		progress bool
		// wantAttempts, and whether the first attempt ran with a plain
		// deadline.
		wantAttempts int
		wantDeadline bool
	}{
		{name: "receiving bytes for 5 timeouts: never cut", progress: true,
			rt: &slowRuntime{pullFor: 5 * timeout, bytesFor: time.Hour}, wantAttempts: 1},
		{name: "no progress source: cut at the timeout, as before",
			rt: &slowRuntime{pullFor: 5 * timeout, bytesFor: time.Hour}, wantAttempts: 2, wantDeadline: true},
		{name: "runtime cannot tell (CRI-O): cut at the timeout", progress: true,
			rt: &slowRuntime{pullFor: 5 * timeout, bytesFor: time.Hour, downloadsErr: fmt.Errorf("%w: Unimplemented", errors.ErrUnsupported)}, wantAttempts: 2, wantDeadline: true},
		{name: "progress unreadable at the start: cut at the timeout", progress: true,
			rt: &slowRuntime{pullFor: 5 * timeout, bytesFor: time.Hour, downloadsErr: errors.New("connection refused")}, wantAttempts: 2, wantDeadline: true},
		{name: "bytes stop arriving: cut a timeout after the last one", progress: true,
			rt: &slowRuntime{pullFor: time.Hour, bytesFor: 2 * timeout}, wantAttempts: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{InitialAttemptTimeout: timeout, MaxAttemptTimeout: timeout, OverallTimeout: guard, Creds: noCreds{}, Log: discard,
				ProgressInterval: timeout / 10,
				// One retry, then stop.
				PermanentAttempts: 1}
			retries := 0
			cfg.Sleep = func(context.Context, time.Duration) error {
				retries++
				if retries > 1 {
					return errors.New("stop")
				}
				// The retry is quick: the next attempt of a stalled
				// pull stalls at once.
				return nil
			}
			if c.progress {
				cfg.Progress = c.rt
			}
			start := time.Now()
			res := New(c.rt, cfg).Run(context.Background(), entries("registry.example.com/app:1"), "")[0]
			took := time.Since(start)
			c.rt.mu.Lock()
			defer c.rt.mu.Unlock()
			if c.rt.pulls != c.wantAttempts {
				t.Fatalf("%d PullImage calls, want %d (result %+v)", c.rt.pulls, c.wantAttempts, res)
			}
			if c.rt.deadline[0] != c.wantDeadline {
				t.Errorf("first attempt had a deadline: %v, want %v", c.rt.deadline[0], c.wantDeadline)
			}
			if c.wantAttempts == 1 {
				if !res.Present || !res.Pulled {
					t.Fatalf("%+v, want pulled in one attempt", res)
				}
				return
			}
			// A cut attempt is a Timeout, whichever way it was cut.
			if len(c.rt.errs) == 0 {
				t.Fatal("no attempt was cut")
			}
			if class, reason := Classify(cutError(context.Background(), c.rt.errs[0])); class != Transient {
				t.Errorf("cut attempt classified %s/%s, want transient", class, reason)
			}
			if c.rt.bytesFor < time.Hour && took < c.rt.bytesFor+timeout {
				t.Errorf("stalled pull cut after %v, before its last byte (%v) plus the timeout (%v)", took, c.rt.bytesFor, timeout)
			}
		})
	}
}

// A try cut for lack of progress fails as a deadline does: transient,
// reason Timeout, with what happened in the message.
func TestNoProgressIsATimeout(t *testing.T) {
	w := &progressWatch{last: time.Now().Add(-time.Hour)}
	tctx, cancel := tryContext(context.Background(), w, 10*time.Millisecond)
	defer cancel()
	<-tctx.Done()
	err := cutError(tctx, status.FromContextError(tctx.Err()).Err())
	if class, reason := Classify(err); class != Transient || reason != ReasonTimeout {
		t.Fatalf("Classify(%v) = %s/%s, want transient Timeout", err, class, reason)
	}
	if want := "no image bytes arrived at the runtime for 10ms"; !contains(want)(0, err.Error()) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	// A try that ends for another reason keeps its own error.
	other := errors.New("not found")
	if got := cutError(context.Background(), other); got != other {
		t.Fatalf("cutError changed an uncut error: %v", got)
	}
}

// observe counts bytes as arrived when a blob grows, a new one starts with
// bytes, or one in the last sample is gone (complete).
func TestObserve(t *testing.T) {
	cases := []struct {
		name      string
		prev, cur map[string]int64
		moved     bool
	}{
		{"nothing", map[string]int64{}, map[string]int64{}, false},
		{"same offsets", map[string]int64{"a": 5}, map[string]int64{"a": 5}, false},
		{"a blob grew", map[string]int64{"a": 5}, map[string]int64{"a": 6}, true},
		{"a new blob with bytes", map[string]int64{"a": 5}, map[string]int64{"a": 5, "b": 1}, true},
		{"a new blob with no bytes yet", map[string]int64{"a": 5}, map[string]int64{"a": 5, "b": 0}, false},
		{"a blob finished", map[string]int64{"a": 5, "b": 3}, map[string]int64{"a": 5}, true},
		{"a cancelled blob left behind, unchanged", map[string]int64{"old": 6 << 20}, map[string]int64{"old": 6 << 20}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := time.Unix(0, 0)
			w := &progressWatch{last: before, prev: c.prev}
			now := time.Unix(100, 0)
			w.observe(c.cur, now)
			if got := w.lastProgress().Equal(now); got != c.moved {
				t.Fatalf("progress seen = %v, want %v", got, c.moved)
			}
		})
	}
}

// The runtime is looked at several times within the shortest attempt
// timeout: every 2 s, or a fifth of the initial timeout when shorter.
func TestProgressIntervalDefault(t *testing.T) {
	cases := []struct {
		initial, interval, want time.Duration
	}{
		{initial: 30 * time.Second, want: 2 * time.Second},
		{initial: 3 * time.Second, want: 600 * time.Millisecond},
		{initial: 200 * time.Millisecond, want: 100 * time.Millisecond},
		{initial: 30 * time.Second, interval: time.Second, want: time.Second},
	}
	for _, c := range cases {
		cfg := Config{InitialAttemptTimeout: c.initial, ProgressInterval: c.interval}
		cfg.defaults()
		if cfg.ProgressInterval != c.want {
			t.Errorf("initial timeout %v, interval %v: got %v, want %v", c.initial, c.interval, cfg.ProgressInterval, c.want)
		}
	}
}
