package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// DefaultWatchInterval is how often Watch looks at the filesystem while
// pulls are in flight. A look is one statfs(2), no runtime call.
const DefaultWatchInterval = 25 * time.Millisecond

// DefaultFiguresWait is how long no pull starts while the figures are
// late, before the run's pulls fail: longer than a kubelet's answers of
// 500 after the node boots, shorter than fetch's wait for a slot.
const DefaultFiguresWait = 2 * time.Minute

// burstLooks is how many looks back Watch measures the bursts it keeps
// room for: 250 ms at the default interval, long enough to hold the layers
// of several pulls landing together.
const burstLooks = 10

// Guard keeps one agent's pulls below the ceiling.
type Guard struct {
	Reader  Reader
	Ceiling Ceiling
	// Interval is how often Watch, and Check while the figures are late,
	// look; DefaultWatchInterval when zero.
	Interval time.Duration
	// FiguresWait is how long Check waits for late figures before it
	// gives up on the run's pulls; DefaultFiguresWait when zero.
	FiguresWait time.Duration
	Log         *slog.Logger

	mu         sync.Mutex
	mountpoint string
	warned     bool
	started    time.Time // when Start last let a pull start
	burst      uint64    // the largest growth Watch saw over burstLooks looks
}

// Usage reads the filesystem. The mountpoint is asked of the runtime
// once (one CRI call); after that, only statfs is read.
func (g *Guard) Usage(ctx context.Context) (Usage, error) {
	g.mu.Lock()
	mp := g.mountpoint
	g.mu.Unlock()
	if mp != "" {
		return g.Reader.Stat(ctx, mp)
	}
	u, err := g.Reader.Read(ctx)
	if u.Mountpoint != "" {
		g.mu.Lock()
		g.mountpoint = u.Mountpoint
		g.mu.Unlock()
	}
	return u, err
}

// Check returns a *FullError when no pull may start. While the figures
// are late (a source failed this time: a kubelet answering 500 after the
// node boots), no pull starts: it waits for them, at most FiguresWait,
// then returns an error that fails the run's images (watch's next check
// tries again). When no source can tell the figures on this node, it says
// so once in the log and lets pulls start: the runtime's own "no space
// left on device" still stops them.
func (g *Guard) Check(ctx context.Context) error {
	_, err := g.check(ctx, time.Time{})
	return err
}

// Start is Check for one pull that starts when it returns nil. On the
// kubelet's figures, read every few seconds, pulls started on one reading
// would all count the same free bytes, however many the others take. So
// it waits for a reading taken after the pull before it started, and
// keeps room for the largest burst Watch has seen, as Watch does for the
// pulls in flight: what lands before the next reading is seen by neither.
// statfs is read at each look: Watch sees a pull at once, and Start
// neither waits nor keeps room.
func (g *Guard) Start(ctx context.Context) error {
	g.mu.Lock()
	after := g.started
	g.mu.Unlock()
	u, err := g.check(ctx, after)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	reading := !u.ReadAt.IsZero()
	if reading && u.Known() && u.UsedBytes()+g.burst >= g.Ceiling.Limit(u.CapacityBytes) {
		return &FullError{Usage: u, Ceiling: g.Ceiling, Projected: true}
	}
	g.started = time.Now()
	return nil
}

// check is Check on figures read no earlier than after; it returns them.
func (g *Guard) check(ctx context.Context, after time.Time) (Usage, error) {
	u, err := g.Usage(ctx)
	if Transient(err) || err == nil && stale(u, after) {
		u, err = g.awaitFigures(ctx, err, after)
	}
	if Transient(err) {
		return u, fmt.Errorf("no pull starts while the image filesystem's figures are unknown: %w", err)
	}
	if err != nil {
		g.warnOnce(err)
		return u, nil
	}
	return u, g.Ceiling.Check(u)
}

// Transient reports whether err, from Usage, Read or Stat, is a source
// of the figures that failed this time and may answer at the next look.
func Transient(err error) bool {
	return errors.Is(err, ErrFiguresLate)
}

// awaitFigures looks again until figures read no earlier than after come,
// ctx ends, or FiguresWait passes; it returns the last look.
func (g *Guard) awaitFigures(ctx context.Context, err error, after time.Time) (Usage, error) {
	wait := g.FiguresWait
	if wait <= 0 {
		wait = DefaultFiguresWait
	}
	if err != nil && g.Log != nil {
		g.Log.Info("no pull starts until the image filesystem's figures come", "maxWait", wait, "err", err)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	// Every Interval, as Watch: the kubelet source answers from its last
	// reading, so a look costs no call.
	t := time.NewTicker(g.interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("%w: none read since %s", ErrFiguresLate, after.Format(time.RFC3339Nano))
			}
			return Usage{}, err
		case <-t.C:
		}
		var u Usage
		if u, err = g.Usage(ctx); !Transient(err) && (err != nil || !stale(u, after)) {
			return u, err
		}
	}
}

// stale reports whether u is a reading taken before after; figures statfs
// gave at the look never are.
func stale(u Usage, after time.Time) bool {
	return !u.ReadAt.IsZero() && u.ReadAt.Before(after)
}

func (g *Guard) warnOnce(err error) {
	g.mu.Lock()
	first := !g.warned
	g.warned = true
	g.mu.Unlock()
	if first && g.Log != nil {
		g.Log.Warn("cannot read the image filesystem's usage: pulls are not held below the disk ceiling, only stopped by the runtime's own out-of-space error", "ceilingPercent", g.Ceiling.Percent, "err", err)
	}
}

// Full describes the runtime's out-of-space error with the usage now.
func (g *Guard) Full(ctx context.Context, cause error) *FullError {
	u, _ := g.Usage(ctx)
	return &FullError{Usage: u, Ceiling: g.Ceiling, Cause: cause}
}

// Watch looks at the filesystem every Interval until ctx ends, and calls
// full once, when it is at the ceiling or would be there soon: when the
// usage plus a headroom reaches it. The headroom is the larger of twice
// the last look's growth (a download streaming on: the time a stop takes
// to land) and the largest growth over burstLooks looks so far (layers
// that a stop does not cut short: CRI-O unpacks a layer to the end once it
// started, and several pulls unpack at once). A look that fails does not
// end the watch: the pulls in flight are checked again at the next look
// that has figures. It returns at once only when no source can tell the
// figures on this node.
func (g *Guard) Watch(ctx context.Context, full func(*FullError)) {
	t := time.NewTicker(g.interval())
	defer t.Stop()
	var recent []uint64
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		u, err := g.Usage(ctx)
		if err != nil {
			if !Transient(err) {
				g.warnOnce(err)
				return
			}
			if g.Log != nil {
				g.Log.Debug("cannot read the image filesystem; the pulls in flight are checked at the next look", "err", err)
			}
			continue
		}
		used, limit := u.UsedBytes(), g.Ceiling.Limit(u.CapacityBytes)
		if used >= limit {
			full(&FullError{Usage: u, Ceiling: g.Ceiling})
			return
		}
		if len(recent) == 0 {
			recent = []uint64{used}
			continue
		}
		grew := growth(recent[len(recent)-1], used)
		if len(recent) > burstLooks {
			recent = recent[1:]
		}
		burst := g.raiseBurst(growth(recent[0], used))
		if used+max(2*grew, burst) >= limit {
			full(&FullError{Usage: u, Ceiling: g.Ceiling, Projected: true})
			return
		}
		recent = append(recent, used)
	}
}

// raiseBurst records a growth over burstLooks looks, and returns the
// largest so far.
func (g *Guard) raiseBurst(grew uint64) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.burst = max(g.burst, grew)
	return g.burst
}

func (g *Guard) interval() time.Duration {
	if g.Interval <= 0 {
		return DefaultWatchInterval
	}
	return g.Interval
}

func growth(from, to uint64) uint64 {
	if to > from {
		return to - from
	}
	return 0
}
