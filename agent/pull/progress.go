package pull

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Progress reports the runtime's partial downloads: each blob it is
// receiving, by name, with the bytes received so far. containerd tells
// (agent/ingest); a runtime that cannot returns an error wrapping
// errors.ErrUnsupported.
//
// It exists because no runtime resumes a pull the CRI caller cancelled:
// containerd 1.6, containerd 2.x and CRI-O all fetch every layer of the
// image again from its first byte on the next attempt, the layers that
// were complete included (tests/runtimes TestCancelledPullStartsOver). A
// deadline that cuts a pull still receiving bytes throws away all it got,
// and on a busy registry the next, slower attempt is cut again.
type Progress interface {
	Downloads(ctx context.Context) (map[string]int64, error)
}

// DefaultProgressInterval is how often the runtime's downloads are looked
// at while images are being pulled, or a fifth of the initial attempt
// timeout when that is shorter.
const DefaultProgressInterval = 2 * time.Second

// progressWatch samples the runtime's downloads and remembers when it last
// saw bytes arrive, for the whole node: the runtime does not say which
// pull a blob belongs to.
type progressWatch struct {
	src      Progress
	interval time.Duration
	log      *slog.Logger

	mu   sync.Mutex
	last time.Time
	prev map[string]int64
}

// watchProgress starts sampling until ctx ends. It returns nil, and
// attempts keep plain deadlines, when there is no source or the runtime
// cannot tell its progress.
func (p *Puller) watchProgress(ctx context.Context) *progressWatch {
	if p.cfg.Progress == nil {
		return nil
	}
	w := &progressWatch{src: p.cfg.Progress, interval: p.cfg.ProgressInterval, last: time.Now(), log: p.cfg.Log}
	cur, err := w.sample(ctx)
	if err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			p.cfg.Log.Info("the runtime reports no download progress: each pull attempt ends at its timeout", "err", err)
		} else {
			p.cfg.Log.Warn("cannot read the runtime's download progress: each pull attempt ends at its timeout", "err", err)
		}
		return nil
	}
	w.prev = cur
	go w.run(ctx)
	return w
}

func (w *progressWatch) run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := w.sample(ctx)
		if err != nil {
			// A runtime restarting or busy: no sign of progress this
			// time, and none of its absence either.
			w.log.Debug("cannot read the runtime's download progress", "err", err)
			continue
		}
		w.log.Debug("runtime downloads", "blobs", len(cur), "moved", w.observe(cur, time.Now()))
	}
}

// sampleTimeout bounds one look at the runtime's downloads: a runtime that
// hangs shows no progress, and must not hold the watch up.
const sampleTimeout = 10 * time.Second

func (w *progressWatch) sample(ctx context.Context) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	return w.src.Downloads(ctx)
}

// observe records a sample. Bytes arrived when a blob grew, a new one
// started with bytes, or one in the last sample is gone (finished: the
// runtime drops a blob from the list once it is complete).
func (w *progressWatch) observe(cur map[string]int64, now time.Time) (moved bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ref, n := range cur {
		if prev, ok := w.prev[ref]; n > 0 && (!ok || n > prev) {
			moved = true
		}
	}
	for ref := range w.prev {
		if _, ok := cur[ref]; !ok {
			moved = true
		}
	}
	if moved {
		w.last = now
	}
	w.prev = cur
	return moved
}

// lastProgress is when bytes were last seen arriving.
func (w *progressWatch) lastProgress() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// errNoProgress is the cause of a try cut off by its timeout.
type errNoProgress struct{ timeout time.Duration }

func (e errNoProgress) Error() string {
	return fmt.Sprintf("no image bytes arrived at the runtime for %s (the attempt timeout)", e.timeout)
}

func (errNoProgress) Unwrap() error { return context.DeadlineExceeded }

// tryContext is the context of one PullImage call. Without a watch it ends
// timeout after the call starts, as a deadline. With one, the timeout
// counts from the later of the call's start and the last byte the runtime
// received: a pull that is still receiving bytes is never cut, however
// long it takes, and one that is stuck ends timeout after the node's
// runtime stopped receiving anything.
func tryContext(ctx context.Context, w *progressWatch, timeout time.Duration) (context.Context, context.CancelFunc) {
	if w == nil {
		return context.WithTimeout(ctx, timeout)
	}
	tctx, cancel := context.WithCancelCause(ctx)
	start := time.Now()
	go func() {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
			}
			idle := time.Since(start)
			if last := w.lastProgress(); last.After(start) {
				idle = time.Since(last)
			}
			if idle >= timeout {
				cancel(errNoProgress{timeout})
				return
			}
			t.Reset(timeout - idle)
		}
	}()
	return tctx, func() { cancel(context.Canceled) }
}

// cutError returns the error of a try whose context tryContext ended, so
// that it is classified as the deadline it stands for.
func cutError(tctx context.Context, err error) error {
	var np errNoProgress
	if err != nil && errors.As(context.Cause(tctx), &np) {
		return fmt.Errorf("%w: %w", np, err)
	}
	return err
}
