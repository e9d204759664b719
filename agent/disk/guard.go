package disk

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultWatchInterval is how often Watch looks at the filesystem while
// pulls are in flight. A look is one statfs(2), no runtime call.
const DefaultWatchInterval = 25 * time.Millisecond

// burstLooks is how many looks back Watch measures the bursts it keeps
// room for: 250 ms at the default interval, long enough to hold the layers
// of several pulls landing together.
const burstLooks = 10

// Guard keeps one agent's pulls below the ceiling.
type Guard struct {
	Reader  Reader
	Ceiling Ceiling
	// Interval is Watch's; DefaultWatchInterval when zero.
	Interval time.Duration
	Log      *slog.Logger

	mu         sync.Mutex
	mountpoint string
	warned     bool
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

// Check returns a *FullError when no pull may start. When the usage
// cannot be read it says so once in the log and lets pulls start: the
// runtime's own "no space left on device" still stops them.
func (g *Guard) Check(ctx context.Context) error {
	u, err := g.Usage(ctx)
	if err != nil {
		g.warnOnce(err)
		return nil
	}
	return g.Ceiling.Check(u)
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
// started, and several pulls unpack at once). It returns at once when the
// usage cannot be read.
func (g *Guard) Watch(ctx context.Context, full func(*FullError)) {
	u, err := g.Usage(ctx)
	if err != nil {
		g.warnOnce(err)
		return
	}
	if err := g.Ceiling.Check(u); err != nil {
		full(err.(*FullError))
		return
	}
	interval := g.Interval
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	mp := u.Mountpoint
	recent := []uint64{u.UsedBytes()}
	var burst uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		u, err := g.Reader.Stat(ctx, mp)
		if err != nil {
			// Gone from under the agent (a runtime restarting with a
			// wiped root): the next look, or the runtime, tells.
			if g.Log != nil {
				g.Log.Debug("cannot read the image filesystem", "err", err)
			}
			continue
		}
		used, limit := u.UsedBytes(), g.Ceiling.Limit(u.CapacityBytes)
		if used >= limit {
			full(&FullError{Usage: u, Ceiling: g.Ceiling})
			return
		}
		grew := growth(recent[len(recent)-1], used)
		if len(recent) > burstLooks {
			recent = recent[1:]
		}
		burst = max(burst, growth(recent[0], used))
		if used+max(2*grew, burst) >= limit {
			full(&FullError{Usage: u, Ceiling: g.Ceiling, Projected: true})
			return
		}
		recent = append(recent, used)
	}
}

func growth(from, to uint64) uint64 {
	if to > from {
		return to - from
	}
	return 0
}
