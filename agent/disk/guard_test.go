package disk

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// countingRuntime counts ImageFsInfo calls.
type countingRuntime struct {
	calls atomic.Int32
	mp    string
}

func (c *countingRuntime) ImageFsInfo(context.Context) ([]cri.Filesystem, error) {
	c.calls.Add(1)
	return []cri.Filesystem{{Mountpoint: c.mp, UsedBytes: 1}}, nil
}

// The runtime is asked where its images are once; the checks before each
// pull and the looks while pulling are statfs only.
func TestGuardAsksTheRuntimeOnce(t *testing.T) {
	rt := &countingRuntime{mp: "/images"}
	g := &Guard{Reader: Reader{Runtime: rt, Statfs: statfsOf(100*mib, 50*mib, nil)}, Ceiling: Ceiling{Percent: 80}}
	for range 5 {
		if err := g.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := rt.calls.Load(); n != 1 {
		t.Errorf("%d ImageFsInfo calls, want 1", n)
	}
}

// Unreadable capacity lets pulls go on, and says so once.
func TestGuardCapacityUnknown(t *testing.T) {
	var logs bytes.Buffer
	rt := &countingRuntime{mp: "/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs"}
	g := &Guard{Reader: Reader{Runtime: rt, Statfs: statfsOf(0, 0, fs.ErrNotExist)}, Ceiling: Ceiling{Percent: 80},
		Log: slog.New(slog.NewTextHandler(&logs, nil))}
	for range 3 {
		if err := g.Check(context.Background()); err != nil {
			t.Fatalf("Check = %v, want nil: the runtime's own error still stops pulls", err)
		}
	}
	if n := strings.Count(logs.String(), "cannot read the image filesystem"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), rt.mp) {
		t.Errorf("the warning does not name the path to mount:\n%s", logs.String())
	}
	var full *FullError
	if err := g.Full(context.Background(), errors.New("no space left on device")); !errors.As(error(err), &full) || !strings.Contains(err.Error(), "capacity unknown") {
		t.Errorf("Full = %v", err)
	}
}

// Watch stops with room for the largest burst it saw: a layer that CRI-O
// unpacks lands whole, whatever a stop says.
func TestWatchKeepsRoomForTheLargestBurst(t *testing.T) {
	// Used MiB at each look: a 15 MiB burst, a pause longer than the
	// burst window, then a slow stream.
	looks := []uint64{10, 25}
	for range burstLooks + 2 {
		looks = append(looks, 25)
	}
	for u := uint64(26); u < 100; u++ {
		looks = append(looks, u)
	}
	i := 0
	statfs := func(string) (uint64, uint64, error) {
		u := looks[min(i, len(looks)-1)]
		i++
		return 100 * mib, (100 - u) * mib, nil
	}
	g := &Guard{Reader: Reader{Runtime: &countingRuntime{mp: "/images"}, Statfs: statfs}, Ceiling: Ceiling{Percent: 80}, Interval: time.Millisecond}
	var got *FullError
	g.Watch(context.Background(), func(e *FullError) { got = e })
	if got == nil || !got.Projected || got.Usage.UsedBytes() != 65*mib {
		t.Fatalf("stopped with %+v, want a projected stop at 65 MiB used (15 MiB of room for the burst)", got)
	}
}

// lateSource is a kubelet that answers 500 until ready, then reports a
// filesystem filling by step at each look.
type lateSource struct {
	ready         time.Time
	used, step    atomic.Uint64
	capacity      uint64
	looksWhenLate atomic.Int32
}

func (l *lateSource) figures(context.Context) (uint64, uint64, time.Time, error) {
	if time.Now().Before(l.ready) {
		l.looksWhenLate.Add(1)
		return 0, 0, time.Time{}, errors.New("kubelet stats: 500 Internal Server Error")
	}
	u := min(l.used.Add(l.step.Load()), l.capacity)
	return l.capacity, l.capacity - u, time.Now(), nil
}

// Finding 2 of issue 48: a figures source failing at the start of a run
// must never let the run pass the ceiling. Check holds pulls until the
// figures come, then stops them at the ceiling; Watch goes on looking
// through failed reads and stops the pulls in flight once figures return.
// Before, Check returned nil at the first failed read and Watch returned
// at once: the pulls then filled the disk.
func TestLateFiguresHoldTheCeiling(t *testing.T) {
	const late = 300 * time.Millisecond
	tests := []struct {
		name  string
		watch bool
		used  uint64 // MiB when figures come
	}{
		{name: "check: no pull starts until figures come, then the ceiling holds", used: 90},
		{name: "check: figures come below the ceiling", used: 10},
		{name: "watch: pulls in flight are checked once figures come", watch: true, used: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &lateSource{ready: time.Now().Add(late), capacity: 100 * mib}
			src.used.Store(tt.used * mib)
			if tt.watch {
				src.step.Store(mib)
			}
			g := &Guard{Reader: Reader{Runtime: &countingRuntime{mp: "/images"}, Statfs: statfsOf(0, 0, fs.ErrNotExist),
				Kubelet: src.figures}, Ceiling: Ceiling{Percent: 80}, Interval: time.Millisecond}
			start := time.Now()
			if tt.watch {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var got *FullError
				g.Watch(ctx, func(e *FullError) { got = e })
				if got == nil || got.Usage.UsedBytes() >= 80*mib {
					t.Fatalf("Watch stopped with %+v, want a stop below the ceiling", got)
				}
			} else {
				err := g.Check(context.Background())
				var full *FullError
				if isFull := errors.As(err, &full); isFull != (tt.used >= 80) {
					t.Fatalf("Check = %v, want a *FullError: %v", err, tt.used >= 80)
				}
			}
			// Against when the figures came, not a duration from start:
			// the source's clock started a moment before it.
			if returned := time.Now(); returned.Before(src.ready) {
				t.Errorf("returned after %s, %s before the figures came", returned.Sub(start), src.ready.Sub(returned))
			}
			if src.looksWhenLate.Load() < 2 {
				t.Errorf("%d looks while late, want several", src.looksWhenLate.Load())
			}
		})
	}
}

// Late figures that never come fail the run's pulls after FiguresWait (a
// retry comes with watch's next check): no pull starts unguarded.
func TestFiguresThatNeverCome(t *testing.T) {
	src := &lateSource{ready: time.Now().Add(time.Hour), capacity: 100 * mib}
	g := &Guard{Reader: Reader{Runtime: &countingRuntime{mp: "/images"}, Statfs: statfsOf(0, 0, fs.ErrNotExist),
		Kubelet: src.figures}, Ceiling: Ceiling{Percent: 80}, Interval: time.Millisecond, FiguresWait: 50 * time.Millisecond}
	err := g.Check(context.Background())
	if err == nil || !Transient(err) || !strings.Contains(err.Error(), "500 Internal Server Error") {
		t.Fatalf("Check = %v, want an error with the kubelet's answer", err)
	}
}

// Start lets a pull start only on figures read after the last start: the
// kubelet's come every few seconds, and pulls started on one reading all
// count the same free bytes. statfs, read at each look, waits for nothing.
func TestStartWaitsForAReadingAfterTheLastStart(t *testing.T) {
	const period = 100 * time.Millisecond
	var readings atomic.Int32
	start := time.Now()
	kubelet := func(context.Context) (uint64, uint64, time.Time, error) {
		// The reading of the last full period, as kube.NodeFigures keeps it.
		n := time.Since(start) / period
		readings.Store(int32(n))
		return 100 * mib, 90 * mib, start.Add(n * period), nil
	}
	tests := []struct {
		name     string
		reader   Reader
		wantWait bool
	}{
		{name: "the kubelet's figures", wantWait: true,
			reader: Reader{Runtime: &countingRuntime{mp: "/images"}, Statfs: statfsOf(0, 0, fs.ErrNotExist), Kubelet: kubelet}},
		{name: "statfs", reader: Reader{Runtime: &countingRuntime{mp: "/images"}, Statfs: statfsOf(100*mib, 90*mib, nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &Guard{Reader: tt.reader, Ceiling: Ceiling{Percent: 80}, Interval: time.Millisecond}
			if err := g.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			first := readings.Load()
			began := time.Now()
			if err := g.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			waited := time.Since(began)
			if !tt.wantWait {
				if waited > period/2 {
					t.Errorf("the second start waited %s on statfs", waited)
				}
				return
			}
			if readings.Load() <= first {
				t.Errorf("the second start came on reading %d, the first's", readings.Load())
			}
		})
	}
}
