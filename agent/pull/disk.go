package pull

import (
	"context"
	"fmt"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
)

// Disk keeps a run's pulls below the image filesystem's ceiling
// (agent/disk's Guard).
type Disk interface {
	// Check returns an error when no pull may start.
	Check(ctx context.Context) error
	// Start is Check for one pull, which starts when it returns nil.
	Start(ctx context.Context) error
	// Watch calls full once when the filesystem reaches the ceiling while
	// pulls are in flight, until ctx ends.
	Watch(ctx context.Context, full func(*disk.FullError))
	// Full describes the runtime's out-of-space error with the usage.
	Full(ctx context.Context, cause error) *disk.FullError
}

// checkDisk returns the reason no pull may start, or nil.
func (p *Puller) checkDisk(ctx context.Context) error {
	if p.cfg.Disk == nil {
		return nil
	}
	return p.cfg.Disk.Check(ctx)
}

// startDisk returns the reason the next pull may not start, or nil.
func (p *Puller) startDisk(ctx context.Context) error {
	if p.cfg.Disk == nil {
		return nil
	}
	return p.cfg.Disk.Start(ctx)
}

// outOfSpace turns the runtime's "no space left on device" into the
// error the run stops with.
func (p *Puller) outOfSpace(ctx context.Context, cause error) error {
	if p.cfg.Disk == nil {
		return cause
	}
	return p.cfg.Disk.Full(ctx, cause)
}

// giveUpDisk reports an image the run stopped pulling, or never started,
// because of the disk.
func (p *Puller) giveUpDisk(j *job, err error) {
	r := j.r
	r.Reason = ReasonInsufficientDisk
	if r.Attempts == 0 {
		r.Message = fmt.Sprintf("not pulled: %v", err)
	} else {
		r.Duration = time.Since(j.start)
		r.Message = err.Error()
	}
	j.log.Error("pull failed", "attempts", r.Attempts, "reason", r.Reason, "err", err)
}
