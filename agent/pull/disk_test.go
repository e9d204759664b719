package pull

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/disk"
)

const mib = 1 << 20

// memFS is an image filesystem in memory. While pulls are in flight
// (writing > 0), every look at it (statfs) finds chunk more bytes written
// per pull: the runtime writes as fast as the agent looks, so what the
// guard sees does not depend on the machine's speed.
type memFS struct {
	mu       sync.Mutex
	capacity uint64
	used     uint64
	max      uint64
	chunk    uint64
	writing  int
	looks    int
}

func (f *memFS) ImageFsInfo(context.Context) ([]cri.Filesystem, error) {
	return []cri.Filesystem{{Mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", UsedBytes: f.usedNow()}}, nil
}

func (f *memFS) statfs(string) (uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.looks++
	f.used = min(f.capacity, f.used+uint64(f.writing)*f.chunk)
	f.max = max(f.max, f.used)
	return f.capacity, f.capacity - f.used, nil
}

func (f *memFS) usedNow() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used
}

func (f *memFS) write(n uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used += n
	f.max = max(f.max, f.used)
}

func (f *memFS) pulling(d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writing += d
}

// guard looks at f every interval while pulls are in flight.
func (f *memFS) guard(percent int, interval time.Duration) *disk.Guard {
	return &disk.Guard{Reader: disk.Reader{Runtime: f, Statfs: f.statfs}, Ceiling: disk.Ceiling{Percent: percent}, Interval: interval, Log: discard}
}

func TestDiskAtCeilingPullsNothing(t *testing.T) {
	fs := &memFS{capacity: 100 * mib, used: 85 * mib}
	rt := newScriptRuntime(nil)
	rt.present["docker.io/library/a:1"] = true
	g := &countingGate{}
	res := New(rt, Config{Creds: noCreds{}, Gate: g, Disk: fs.guard(80, time.Millisecond), Log: discard}).Run(context.Background(), entries("a:1", "b:1", "c:1"), "")
	if g.acquired != 0 {
		t.Errorf("a pull slot was taken %d times on a full disk", g.acquired)
	}
	if !res[0].Present {
		t.Errorf("the present image: %+v", res[0])
	}
	for _, r := range res[1:] {
		if r.Reason != ReasonInsufficientDisk || r.Attempts != 0 || rt.callsFor(r.Normalized) != 0 {
			t.Errorf("%s: reason %q, %d attempts, %d pulls; want InsufficientDisk without a pull", r.Normalized, r.Reason, r.Attempts, rt.callsFor(r.Normalized))
		}
		for _, want := range []string{"not pulled", "85% used (85.0 MiB of 100.0 MiB)", "ceiling 80% (80.0 MiB)"} {
			if !strings.Contains(r.Message, want) {
				t.Errorf("%s: message %q lacks %q", r.Normalized, r.Message, want)
			}
		}
	}
}

// Each pull start looks at the disk: the one after the pull that filled it
// does not start, even when the watch in flight has not looked yet.
func TestCeilingReachedBetweenPulls(t *testing.T) {
	fs := &memFS{capacity: 100 * mib, used: 50 * mib}
	rt := newScriptRuntime(nil)
	rt.pulled = func(string) { fs.write(20 * mib) }
	res := New(rt, Config{Creds: noCreds{}, Parallelism: 1, Disk: fs.guard(80, time.Hour), Log: discard}).Run(context.Background(), entries("a:1", "b:1", "c:1", "d:1"), "")
	var reasons []string
	for _, r := range res {
		reasons = append(reasons, r.Reason)
	}
	// 50 -> 70 -> 90: c and d never start.
	want := []string{"", "", ReasonInsufficientDisk, ReasonInsufficientDisk}
	if strings.Join(reasons, ",") != strings.Join(want, ",") {
		t.Fatalf("reasons %q, want %q", reasons, want)
	}
	if n := rt.callsFor("docker.io/library/c:1") + rt.callsFor("docker.io/library/d:1"); n != 0 {
		t.Errorf("%d pulls started at or above the ceiling", n)
	}
}

// Pulls in flight are stopped before the ceiling when the disk fills
// towards it, and neither they nor the queued images are tried again.
func TestFillingDiskStopsPullsInFlight(t *testing.T) {
	fs := &memFS{capacity: 100 * mib, used: 10 * mib, chunk: mib}
	rt := newScriptRuntime(nil)
	rt.release = make(chan struct{}) // never released: pulls write until stopped
	arrived := make(chan string, 10)
	rt.arrived = arrived
	p := New(rt, Config{Creds: noCreds{}, Parallelism: 2, Disk: fs.guard(80, time.Millisecond), Log: discard})
	done := make(chan []Result)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	go func() { done <- p.Run(ctx, entries("a:1", "b:1", "c:1", "d:1"), "") }()
	for range 2 {
		<-arrived
		fs.pulling(1)
	}
	res := <-done
	stoppedAtCeiling(ctx, t, fs, res)
	for _, r := range res {
		if calls, want := rt.callsFor(r.Normalized), min(r.Attempts, 1); calls != want || r.Attempts > 1 {
			t.Errorf("%s: %d pulls, %d attempts: the stop must be final", r.Normalized, calls, r.Attempts)
		}
	}
	if !strings.Contains(res[0].Message, "about to reach its ceiling") || !strings.Contains(res[3].Message, "not pulled") {
		t.Errorf("messages %q / %q", res[0].Message, res[3].Message)
	}
}

// The runtime's own "no space left on device" ends the run at once: no
// retry of that image, the other pull in flight is cancelled, the queued
// ones never start, and no other credential is tried.
func TestOutOfSpaceIsFinalForTheRun(t *testing.T) {
	for _, withDisk := range []bool{true, false} {
		name := "without a disk reader"
		if withDisk {
			name = "with a disk reader"
		}
		t.Run(name, func(t *testing.T) {
			fs := &memFS{capacity: 100 * mib, used: 10 * mib}
			rt := &enospcRuntime{calls: map[string]int{}, bStarted: make(chan struct{})}
			cfg := Config{Creds: twoCreds{}, Parallelism: 2, Log: discard}
			if withDisk {
				cfg.Disk = fs.guard(80, time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), guard)
			defer cancel()
			res := New(rt, cfg).Run(ctx, entries("b:1", "a:1", "c:1"), "")
			if ctx.Err() != nil {
				t.Fatal("the run ended at the test's guard: the pull in flight was not stopped")
			}
			for _, r := range res {
				if r.Reason != ReasonInsufficientDisk {
					t.Errorf("%s: reason %q (%s), want InsufficientDisk", r.Normalized, r.Reason, r.Message)
				}
			}
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if n := rt.calls["docker.io/library/a:1"]; n != 1 {
				t.Errorf("a was pulled %d times, want once: no retry, no other credential", n)
			}
			if n := rt.calls["docker.io/library/c:1"]; n != 0 {
				t.Errorf("c was pulled %d times after the disk was full", n)
			}
			if !strings.Contains(res[1].Message, "no space left on device") {
				t.Errorf("a's message %q lacks the runtime's error", res[1].Message)
			}
			if withDisk && !strings.Contains(res[1].Message, "10% used (10.0 MiB of 100.0 MiB), ceiling 80% (80.0 MiB)") {
				t.Errorf("a's message %q lacks the usage", res[1].Message)
			}
		})
	}
}

// enospcRuntime runs out of space on a:1 once b:1 is being pulled; b:1
// then runs until it is cancelled.
type enospcRuntime struct {
	mu       sync.Mutex
	calls    map[string]int
	bStarted chan struct{}
}

func (*enospcRuntime) ImageStatus(context.Context, string) (*cri.ImageInfo, error) { return nil, nil }

func (m *enospcRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	ref = containerdRef(ref)
	if err := ctx.Err(); err != nil {
		return "", err
	}
	m.mu.Lock()
	m.calls[ref]++
	first := m.calls[ref] == 1
	m.mu.Unlock()
	switch ref {
	case "docker.io/library/b:1":
		if first {
			close(m.bStarted)
		}
		<-ctx.Done()
		return "", status.FromContextError(ctx.Err()).Err()
	case "docker.io/library/a:1":
		<-m.bStarted
		return "", status.Error(codes.Unknown, `failed to pull and unpack image "docker.io/library/a:1": failed to copy: write /var/lib/containerd/io.containerd.content.v1.content/ingest/x/data: no space left on device`)
	}
	return ref, nil
}

type twoCreds struct{}

func (twoCreds) Lookup(context.Context, string) []cri.Auth {
	return []cri.Auth{{Username: "one"}, {Username: "two"}}
}

// Unreadable usage (the mountpoint not mounted into the pod) does not stop
// pulls: the runtime's own error still would.
func TestUnknownCapacityPulls(t *testing.T) {
	g := &disk.Guard{Reader: disk.Reader{Runtime: &memFS{}, Statfs: func(string) (uint64, uint64, error) {
		return 0, 0, errors.New("statfs: no such file or directory")
	}}, Ceiling: disk.Ceiling{Percent: 80}, Log: discard}
	rt := newScriptRuntime(nil)
	res := New(rt, Config{Creds: noCreds{}, Disk: g, Log: discard}).Run(context.Background(), entries("a:1"), "")
	if !res[0].Present || !res[0].Pulled {
		t.Errorf("%+v", res[0])
	}
}

// Issue 48, finding 2: a figures source that fails at the start of a run
// (a kubelet answering 500 after the node boots) must not let the run
// pass the ceiling. No pull starts while the figures are late; once they
// come, the pulls are watched and stopped before the ceiling. Before, the
// first failed read let every pull start and ended the watch: the pulls
// then filled the disk.
func TestLateFiguresNeverPassTheCeiling(t *testing.T) {
	fs := &memFS{capacity: 100 * mib, used: 10 * mib, chunk: mib}
	ready := time.Now().Add(300 * time.Millisecond)
	var lateLooks atomic.Int32
	kubelet := func(context.Context) (uint64, uint64, time.Time, error) {
		if time.Now().Before(ready) {
			lateLooks.Add(1)
			return 0, 0, time.Time{}, errors.New("kubelet stats: 500 Internal Server Error")
		}
		c, a, err := fs.statfs("")
		return c, a, time.Now(), err
	}
	g := &disk.Guard{Reader: disk.Reader{Runtime: fs, Kubelet: kubelet,
		Statfs: func(string) (uint64, uint64, error) { return 0, 0, errors.New("not mounted") }},
		Ceiling: disk.Ceiling{Percent: 80}, Interval: time.Millisecond, Log: discard}
	rt := newScriptRuntime(nil)
	rt.release = make(chan struct{}) // never released: pulls write until stopped
	arrived := make(chan string, 10)
	rt.arrived = arrived
	p := New(rt, Config{Creds: noCreds{}, Parallelism: 2, Disk: g, Log: discard})
	done := make(chan []Result)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	go func() { done <- p.Run(ctx, entries("a:1", "b:1", "c:1", "d:1"), "") }()
	for range 2 {
		<-arrived
		if time.Now().Before(ready) {
			t.Error("a pull started while the figures were late")
		}
		fs.pulling(1)
	}
	res := <-done
	stoppedAtCeiling(ctx, t, fs, res)
	if n := lateLooks.Load(); n < 2 {
		t.Errorf("%d looks while the figures were late, want the guard to keep looking", n)
	}
}

// stoppedAtCeiling checks that a run over a 100 MiB filesystem ended at
// the 80% ceiling, not at the test's guard: the disk stayed below it and
// every image failed as InsufficientDisk.
func stoppedAtCeiling(ctx context.Context, t *testing.T, fs *memFS, res []Result) {
	t.Helper()
	if ctx.Err() != nil {
		t.Fatal("the run ended at the test's guard, not at the ceiling")
	}
	limit := disk.Ceiling{Percent: 80}.Limit(100 * mib)
	if fs.max >= limit {
		t.Errorf("the disk reached %s, at or above the ceiling of %s", disk.Bytes(fs.max), disk.Bytes(limit))
	}
	for _, r := range res {
		if r.Reason != ReasonInsufficientDisk {
			t.Errorf("%s: reason %q, want InsufficientDisk", r.Normalized, r.Reason)
		}
	}
}

// kubeletEvery is the kubelet source as kube.NodeFigures gives it: fs
// read at most once a period, the last reading (and its time) in between.
func kubeletEvery(fs *memFS, period time.Duration) func(context.Context) (uint64, uint64, time.Time, error) {
	var mu sync.Mutex
	var capacity, avail uint64
	var at time.Time
	return func(context.Context) (uint64, uint64, time.Time, error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(at) >= period {
			capacity, avail, _ = fs.statfs("")
			at = time.Now()
		}
		return capacity, avail, at, nil
	}
}

// Issue 48: with the kubelet's figures, read every few seconds, the pulls
// started on one reading all counted the same free bytes: on a real node
// whose pulls land within a reading, the run passed the ceiling
// (tests/disk TestLateKubeletFigures). Each pull now starts on a reading
// taken after the one before started, with room for the largest burst
// seen: 10 -> 25 -> 40 -> 55, then the watch stops the run (55 and twice
// the last growth pass 80), or one more starts first (55 and the largest
// burst do not) and takes the disk to 70; the next would pass 80.
func TestFiguresReadEverySoOftenHoldTheCeiling(t *testing.T) {
	fs := &memFS{capacity: 100 * mib, used: 10 * mib}
	rt := newScriptRuntime(nil)
	rt.pulled = func(string) { fs.write(15 * mib) }
	g := &disk.Guard{Reader: disk.Reader{Runtime: fs, Kubelet: kubeletEvery(fs, 20*time.Millisecond),
		Statfs: func(string) (uint64, uint64, error) { return 0, 0, errors.New("not mounted") }},
		Ceiling: disk.Ceiling{Percent: 80}, Interval: time.Millisecond, Log: discard}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	res := New(rt, Config{Creds: noCreds{}, Parallelism: 4, Disk: g, Log: discard}).Run(ctx, entries("a:1", "b:1", "c:1", "d:1", "e:1", "f:1"), "")
	if ctx.Err() != nil {
		t.Fatal("the run ended at the test's guard")
	}
	limit := disk.Ceiling{Percent: 80}.Limit(100 * mib)
	if fs.max >= limit {
		t.Errorf("the disk reached %s, at or above the ceiling of %s", disk.Bytes(fs.max), disk.Bytes(limit))
	}
	var pulled int
	for _, r := range res {
		switch {
		case r.Reason == "":
			pulled++
		case r.Reason != ReasonInsufficientDisk:
			t.Errorf("%s: reason %q, want InsufficientDisk", r.Normalized, r.Reason)
		}
	}
	if pulled < 3 || pulled > 4 {
		t.Errorf("%d images pulled, want 3 or 4", pulled)
	}
}
