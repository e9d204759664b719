// Package pull pulls a list of images through the CRI with bounded
// parallelism, classified retries and credential fallback.
package pull

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// Runtime is the part of the CRI the puller needs.
type Runtime interface {
	ImageStatus(ctx context.Context, ref string) (*cri.ImageInfo, error)
	PullImage(ctx context.Context, ref string, auth *cri.Auth) (string, error)
}

// Credentials returns the credentials to try for an image, best first.
// Anonymous is always tried last by the puller and must not be included.
type Credentials interface {
	Lookup(ctx context.Context, image string) []cri.Auth
}

// Gate limits how many nodes pull at the same time (herd control). Hold is
// called once per run, only when at least one image really needs pulling,
// and the slot is released when pulling is done.
type Gate interface {
	Hold(ctx context.Context) (Slot, error)
}

// Slot is a held slot of a gate.
type Slot interface {
	Release()
	// Lost is closed when the slot is lost while held: the puller then
	// stops pulling, and waits for a slot again.
	Lost() <-chan struct{}
}

// Observer receives measurements, for metrics.
type Observer interface {
	Attempt(class Class)
	Pulled(image string, d time.Duration, bytes uint64)
}

// UnclassifiedCounter is an Observer that also counts the errors no
// classifier rule recognised (see Explain). Optional, so that existing
// observers need not change.
type UnclassifiedCounter interface {
	Unclassified()
}

type nopObserver struct{}

func (nopObserver) Attempt(Class)                        {}
func (nopObserver) Pulled(string, time.Duration, uint64) {}

// Config tunes a Puller. Zero values get the defaults of the fetch command.
type Config struct {
	Parallelism           int
	Policy                v1alpha1.PullPolicy
	InitialAttemptTimeout time.Duration
	MaxAttemptTimeout     time.Duration
	InitialDelay          time.Duration
	MaxDelay              time.Duration
	// OverallTimeout bounds pulling once the gate is acquired.
	OverallTimeout time.Duration
	// Progress, when set, turns the attempt timeout into a time without
	// any byte arriving at the runtime (progress.go); ProgressInterval is
	// how often it is asked.
	Progress         Progress
	ProgressInterval time.Duration
	// PermanentAttempts caps the attempts for an image whose errors are
	// permanent (not found, unauthorized, ...).
	PermanentAttempts int

	// Gate is herd control; nil lets every node pull at once.
	Gate Gate
	// Disk, when set, holds pulls below the image filesystem's ceiling:
	// none starts at or above it, and once one reaches it (or the runtime
	// runs out of space) the run stops pulling (disk.go).
	Disk Disk
	// Waiting, when set, is called with the results of the ImageStatus
	// pass just before a slot is asked for, when something needs pulling:
	// watch uses it to tell the truth about a missing image while it waits.
	Waiting func(results []Result)
	// Hold, when set, is asked about each image the ImageStatus pass did
	// not find: true keeps it from being pulled, with the Reason and
	// Message Hold set (watch: an image the node's image GC keeps
	// removing, agent/gcguard).
	Hold     func(r *Result) bool
	Creds    Credentials
	Observer Observer
	Log      *slog.Logger
	// Sleep waits between attempts; tests replace it to run without delays.
	// It is called for several images at once, and must return ctx's error
	// when ctx ends first.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a uniform number in [0,1) for jitter.
	Rand func() float64
}

func (c *Config) defaults() {
	if c.Parallelism <= 0 {
		c.Parallelism = 1
	}
	if c.Policy == "" {
		c.Policy = v1alpha1.PullKubelet
	}
	if c.InitialAttemptTimeout <= 0 {
		c.InitialAttemptTimeout = 30 * time.Second
	}
	if c.MaxAttemptTimeout < c.InitialAttemptTimeout {
		c.MaxAttemptTimeout = c.InitialAttemptTimeout
	}
	if c.InitialDelay <= 0 {
		c.InitialDelay = time.Second
	}
	if c.MaxDelay < c.InitialDelay {
		c.MaxDelay = c.InitialDelay
	}
	if c.OverallTimeout <= 0 {
		c.OverallTimeout = 20 * time.Minute
	}
	if c.PermanentAttempts <= 0 {
		c.PermanentAttempts = 3
	}
	if c.ProgressInterval <= 0 {
		// Several looks within the shortest timeout, so that one look
		// that comes too early, or fails, does not cut a pull.
		c.ProgressInterval = max(min(DefaultProgressInterval, c.InitialAttemptTimeout/5), 100*time.Millisecond)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Sleep == nil {
		c.Sleep = sleepCtx
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Result is the outcome for one image of the list.
type Result struct {
	// Image is the reference as written in the list.
	Image string
	// Normalized is the fully qualified form, for de-duplication, display
	// and credential lookup (as the kubelet looks credentials up).
	Normalized string
	// Ref is what every CRI call asks for: the reference the kubelet sends
	// for Image in a pod spec (imagelist.KubeletRef), so that CRI-O
	// resolves a short name through its aliases exactly as for the pods.
	Ref     string
	Present bool
	// ID is the runtime's image ID of a present image.
	ID string
	// Pulled is true when this run pulled the image.
	Pulled   bool
	Attempts int
	Reason   string
	Message  string
	Duration time.Duration
	Bytes    uint64
}

// Puller pulls lists of images.
type Puller struct {
	rt  Runtime
	cfg Config

	mu sync.Mutex
	// logged holds the unclassified messages already logged in full.
	logged map[string]bool
}

// New returns a Puller.
func New(rt Runtime, cfg Config) *Puller {
	cfg.defaults()
	return &Puller{rt: rt, cfg: cfg}
}

// Run makes every valid entry present, following policy (the configured one
// when empty), and returns one result per entry in list order. When ctx ends
// before the gate is acquired, every image to pull is reported as Timeout.
func (p *Puller) Run(ctx context.Context, entries []imagelist.Entry, policy v1alpha1.PullPolicy) []Result {
	if policy == "" {
		policy = p.cfg.Policy
	}
	results := make([]Result, len(entries))
	var check []int
	pullAnyway := make([]bool, len(entries))
	for i, e := range entries {
		results[i] = Result{Image: e.Ref, Normalized: e.Normalized}
		if e.Err == nil {
			results[i].Ref, e.Err = imagelist.KubeletRef(e.Ref)
		}
		if e.Err != nil {
			results[i].Reason, results[i].Message = ReasonInvalidReference, e.Err.Error()
			continue
		}
		// Under herd control, a :latest image under the Kubelet policy is
		// pulled only when missing: pulled on every run, it would make
		// every node with every image present take a slot. Pods ask the
		// registry for it anyway when they start.
		if policy == v1alpha1.PullAlways || policy == v1alpha1.PullKubelet && imagelist.PullAlways(e.Normalized) && p.cfg.Gate == nil {
			pullAnyway[i] = true
			continue
		}
		check = append(check, i)
	}
	// Under IfNotPresent, a present image costs one ImageStatus call and no
	// registry traffic.
	statusFailed := make([]bool, len(entries))
	for k, err := range p.statusAll(ctx, results, check) {
		if err != nil {
			i := check[k]
			p.cfg.Log.Warn("image status failed; pulling, and looking again if the pull fails", "image", results[i].Normalized, "err", err)
			statusFailed[i] = true
		}
	}
	var todo []int
	for i, e := range entries {
		if e.Err != nil || results[i].Present && !pullAnyway[i] {
			continue
		}
		if !results[i].Present && p.cfg.Hold != nil && p.cfg.Hold(&results[i]) {
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return results
	}
	// A full disk is known before a herd-control slot is taken: waiting
	// for one would only hold it from a node that can pull.
	if err := p.checkDisk(ctx); err != nil {
		for _, i := range todo {
			p.giveUpDisk(p.newJob(&results[i]), err)
		}
		p.recheck(ctx, results, todo, statusFailed)
		return results
	}
	if p.cfg.Waiting != nil {
		p.cfg.Waiting(results)
	}
	pending := make([]*job, len(todo))
	for k, i := range todo {
		pending[k] = p.newJob(&results[i])
		pending[k].statusFailed = statusFailed[i]
	}
	// --overall-timeout counts only the time a slot is held: a slot lost
	// on the way (see holdAndPull) is waited for again off the clock.
	budget := p.cfg.OverallTimeout
	for again := false; len(pending) > 0; again = true {
		var err error
		pending, budget, err = p.holdAndPull(ctx, pending, budget)
		if err != nil {
			what := "waiting for a pull slot"
			if again {
				what = "waiting for a pull slot again, after losing one"
			}
			for _, j := range pending {
				j.r.Reason, j.r.Message = ReasonTimeout, fmt.Sprintf("%s: %v", what, err)
			}
			break
		}
	}
	p.recheck(ctx, results, todo, statusFailed)
	return results
}

// ErrSlotLost is the cause of a pull run's context ending because its
// herd-control slot was lost.
var ErrSlotLost = errors.New("the pull slot was lost")

// holdAndPull takes a slot and pulls jobs while it is held, for at most
// budget. If the slot is lost meanwhile (a holder that cannot renew its
// Lease for two thirds of its duration, say during an API outage), the
// calls in flight are cancelled and no new ones start: after the full
// lease duration another node may take the slot, and the cap must hold.
// It returns the jobs that were interrupted that way, and what is left of
// the budget.
func (p *Puller) holdAndPull(ctx context.Context, jobs []*job, budget time.Duration) ([]*job, time.Duration, error) {
	slot, err := p.hold(ctx)
	if err != nil {
		return jobs, budget, err
	}
	defer slot.Release()
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, max(budget, 0))
	defer cancel()
	lctx, lose := context.WithCancelCause(pctx)
	defer lose(nil)
	if lost := slot.Lost(); lost != nil {
		go func() {
			select {
			case <-lost:
				lose(ErrSlotLost)
			case <-lctx.Done():
			}
		}()
	}
	left := p.pullAll(lctx, jobs, p.watchProgress(lctx))
	if len(left) > 0 {
		p.cfg.Log.Warn("lost the pull slot; stopped pulling until a slot is held again", "images", len(left))
	}
	return left, budget - time.Since(start), nil
}

// hold takes a slot from the gate, if there is one.
func (p *Puller) hold(ctx context.Context) (Slot, error) {
	if p.cfg.Gate == nil {
		return noSlot{}, nil
	}
	return p.cfg.Gate.Hold(ctx)
}

// noSlot is what pulling without herd control holds.
type noSlot struct{}

func (noSlot) Release()              {}
func (noSlot) Lost() <-chan struct{} { return nil }

// slotLost reports whether ctx ended because the slot was lost.
func slotLost(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrSlotLost) }

// recheck looks again at the images whose ImageStatus call failed and that
// are still reported missing (the run ended before an attempt could look,
// or the wait for a pull slot failed): an image that is there is present,
// whatever the pull said.
func (p *Puller) recheck(ctx context.Context, results []Result, todo []int, statusFailed []bool) {
	if ctx.Err() != nil {
		return
	}
	var again []int
	for _, i := range todo {
		if statusFailed[i] && !results[i].Present {
			again = append(again, i)
		}
	}
	for k, err := range p.statusAll(ctx, results, again) {
		if i := again[k]; err == nil && results[i].Present {
			results[i].Reason, results[i].Message = "", ""
			p.cfg.Log.Info("image is present after all; its first ImageStatus call had failed", "image", results[i].Normalized)
		}
	}
}

// statusAll asks the runtime about results[i] for every i in idx, at most
// StatusParallelism calls at once, and marks the present ones. It returns
// each call's error, in idx order.
func (p *Puller) statusAll(ctx context.Context, results []Result, idx []int) []error {
	errs := make([]error, len(idx))
	sem := make(chan struct{}, StatusParallelism)
	var wg sync.WaitGroup
	for k, i := range idx {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r := &results[i]
			info, err := p.rt.ImageStatus(ctx, r.Ref)
			if err != nil {
				errs[k] = err
				return
			}
			if info != nil {
				r.Present, r.ID, r.Bytes = true, info.ID, info.Size
				p.cfg.Log.Debug("image present", "image", r.Normalized)
			}
		})
	}
	wg.Wait()
	return errs
}

// job is one image being pulled: its result and its retry state.
type job struct {
	r              *Result
	log            *slog.Logger
	start          time.Time
	attemptTimeout time.Duration
	delay          time.Duration
	permanent      int
	lastErr        error
	lastReason     string
	// statusFailed: ImageStatus failed before the pull, so the image may be
	// there after all.
	statusFailed bool
}

func (p *Puller) newJob(r *Result) *job {
	return &job{
		r:              r,
		log:            p.cfg.Log.With("image", r.Normalized),
		attemptTimeout: p.cfg.InitialAttemptTimeout,
		delay:          p.cfg.InitialDelay,
	}
}

// attemptDone is the outcome of one attempt, with the image's size after a
// success.
type attemptDone struct {
	j     *job
	err   error
	id    string
	bytes uint64
	// found: the attempt failed but the image turned out to be present.
	found bool
}

// backoffDone says that an image's delay before its next attempt is over;
// err is set when the run ended during the delay.
type backoffDone struct {
	j   *job
	err error
}

// pullAll pulls every job with at most Parallelism of them in the runtime at
// once. A slot is held only while the runtime works on an image, never during
// the delay before a retry: otherwise Parallelism images on a failing
// registry would keep every other image from the runtime until the overall
// timeout. Images wait for a slot in one FIFO queue, in list order at first,
// and an image whose delay is over joins its end. So an image, new or
// retrying, waits only for one attempt of each image queued ahead of it:
// neither the images on a failing registry nor the fresh ones can keep the
// others from the runtime for good.
//
// Only this goroutine touches the queue, the counters and the results; the
// goroutines it starts report back on channels.
func (p *Puller) pullAll(ctx context.Context, queue []*job, w *progressWatch) (interrupted []*job) {
	attempts := make(chan attemptDone)
	backoffs := make(chan backoffDone)
	// A full disk ends the attempts in flight and the delays before the
	// next ones at once, through actx (disk.go).
	actx, stop := context.WithCancel(ctx)
	defer stop()
	var full error
	fullNow := make(chan error, 1)
	if p.cfg.Disk != nil {
		go p.cfg.Disk.Watch(actx, func(err *disk.FullError) { fullNow <- err })
	}
	stopForDisk := func(err error) {
		if full == nil {
			full = err
			stop()
			p.cfg.Log.Error("stopped pulling: the image filesystem is full for this run", "err", err)
		}
	}
	inFlight, sleeping := 0, 0
	for {
		if ctx.Err() != nil {
			if slotLost(ctx) {
				interrupted = append(interrupted, queue...)
			} else {
				for _, j := range queue {
					p.giveUp(ctx, j)
				}
			}
			queue = nil
		}
		// The disk is checked before each pull: figures that come every
		// few seconds (the kubelet's) start one pull each.
		for full == nil && inFlight < p.cfg.Parallelism && len(queue) > 0 {
			if err := p.startDisk(ctx); err != nil {
				stopForDisk(err)
				break
			}
			j := queue[0]
			queue = queue[1:]
			if j.r.Attempts == 0 {
				j.start = time.Now()
			}
			j.r.Attempts++
			inFlight++
			go func() { attempts <- p.runAttempt(actx, j, w) }()
		}
		if full != nil {
			for _, j := range queue {
				p.giveUpDisk(j, full)
			}
			queue = nil
		}
		if inFlight == 0 && sleeping == 0 && len(queue) == 0 {
			return interrupted
		}
		// Queued images are given up on as soon as the run ends, without
		// waiting for the calls in flight to notice.
		var done <-chan struct{}
		if len(queue) > 0 {
			done = ctx.Done()
		}
		select {
		case d := <-attempts:
			inFlight--
			if d.err != nil && slotLost(ctx) {
				// Cut short by the lost slot: not the image's failure.
				d.j.r.Attempts--
				interrupted = append(interrupted, d.j)
				continue
			}
			if d.err != nil && full == nil && Explain(d.err).Reason == ReasonInsufficientDisk {
				p.cfg.Observer.Attempt(Permanent)
				stopForDisk(p.outOfSpace(ctx, d.err))
			}
			if d.err != nil && full != nil {
				p.giveUpDisk(d.j, full)
				continue
			}
			if wait, retry := p.settle(ctx, d); retry {
				sleeping++
				go func() { backoffs <- backoffDone{d.j, p.cfg.Sleep(actx, wait)} }()
			}
		case b := <-backoffs:
			sleeping--
			if full != nil {
				p.giveUpDisk(b.j, full)
				continue
			}
			if b.err != nil {
				if slotLost(ctx) {
					interrupted = append(interrupted, b.j)
				} else {
					p.giveUp(ctx, b.j)
				}
				continue
			}
			queue = append(queue, b.j)
		case err := <-fullNow:
			stopForDisk(err)
		case <-done:
		}
	}
}

// runAttempt makes one attempt while holding a slot. The credential lookup
// and the size query after a success also run here, because both may be slow
// (an exec plugin, a busy runtime) and must not stall the other images.
// Credentials are looked up again for every attempt, as the kubelet does for
// every pull: a plugin that failed once (throttled by its cloud API) is asked
// again, and a rotated pull secret is used at once. Plugins cache their
// answers as they ask, so this costs no extra plugin runs.
func (p *Puller) runAttempt(ctx context.Context, j *job, w *progressWatch) attemptDone {
	auths := p.cfg.Creds.Lookup(ctx, j.r.Normalized)
	d := attemptDone{j: j, err: p.attempt(ctx, j.r.Ref, auths, j.attemptTimeout, w)}
	if d.err != nil && j.statusFailed {
		// The pull was made only because ImageStatus failed; a registry
		// that cannot be reached must not turn a present image into a
		// failure.
		if info, err := p.rt.ImageStatus(ctx, j.r.Ref); err == nil && info != nil {
			d.err, d.found, d.id, d.bytes = nil, true, info.ID, info.Size
		}
		return d
	}
	if d.err == nil {
		if info, err := p.rt.ImageStatus(ctx, j.r.Ref); err == nil && info != nil {
			d.id, d.bytes = info.ID, info.Size
		}
	}
	return d
}

// settle records an attempt's outcome. It returns the delay before the next
// attempt, and false when the image is done: pulled, or given up on.
func (p *Puller) settle(ctx context.Context, d attemptDone) (time.Duration, bool) {
	j, r := d.j, d.j.r
	if d.found {
		r.Present, r.Reason, r.Message, r.ID, r.Bytes = true, "", "", d.id, d.bytes
		j.log.Info("image is present after all; its ImageStatus call had failed, and the pull failed too", "attempts", r.Attempts)
		return 0, false
	}
	if d.err == nil {
		r.Present, r.Pulled, r.Reason, r.Message, r.ID = true, true, "", "", d.id
		r.Duration, r.Bytes = time.Since(j.start), d.bytes
		p.cfg.Observer.Attempt("success")
		p.cfg.Observer.Pulled(r.Normalized, r.Duration, r.Bytes)
		j.log.Info("pulled", "attempts", r.Attempts, "duration", r.Duration.Round(time.Millisecond), "bytes", r.Bytes)
		return 0, false
	}
	v := Explain(d.err)
	class, reason := v.Class, v.Reason
	p.cfg.Observer.Attempt(class)
	if v.Unclassified() {
		p.unclassified(j, d.err)
	}
	j.lastErr, j.lastReason = d.err, reason
	if ctx.Err() != nil {
		p.giveUp(ctx, j)
		return 0, false
	}
	if class == Permanent {
		j.permanent++
		if j.permanent >= p.cfg.PermanentAttempts {
			p.giveUp(ctx, j)
			return 0, false
		}
	}
	wait := Jitter(j.delay, p.cfg.Rand())
	j.log.Warn("pull attempt failed", "attempt", r.Attempts, "class", class, "reason", reason, "retryIn", wait.Round(time.Millisecond), "err", d.err)
	j.delay = Doubling(j.delay, p.cfg.MaxDelay)
	j.attemptTimeout = Doubling(j.attemptTimeout, p.cfg.MaxAttemptTimeout)
	return wait, true
}

// unclassified counts an error no rule recognised and logs its full text the
// first time it is seen, so that a runtime's new wording can be added to
// the classifier (docs/agent.md) without flooding the log on every retry.
func (p *Puller) unclassified(j *job, err error) {
	if c, ok := p.cfg.Observer.(UnclassifiedCounter); ok {
		c.Unclassified()
	}
	msg := err.Error()
	p.mu.Lock()
	first := !p.logged[msg]
	if first {
		if p.logged == nil {
			p.logged = map[string]bool{}
		}
		p.logged[msg] = true
	}
	p.mu.Unlock()
	if first {
		j.log.Warn("unclassified pull error: retried as transient", "class", "unclassified", "err", msg)
	}
}

// giveUp reports a failed image. A permanent reason is kept even when the
// run ended meanwhile: it says more than Timeout would.
func (p *Puller) giveUp(ctx context.Context, j *job) {
	r := j.r
	if r.Attempts == 0 {
		r.Reason = ReasonTimeout
		r.Message = fmt.Sprintf("not attempted: the overall timeout ran out while it waited for a pull slot (parallelism %d): %v", p.cfg.Parallelism, ctx.Err())
		j.log.Error("pull failed", "attempts", 0, "reason", r.Reason, "err", ctx.Err())
		return
	}
	r.Duration = time.Since(j.start)
	r.Reason, r.Message = j.lastReason, j.lastErr.Error()
	if ctx.Err() != nil && j.lastReason != ReasonNotFound && j.lastReason != ReasonUnauthorized && j.lastReason != ReasonForbidden {
		r.Reason = ReasonTimeout
		r.Message = fmt.Sprintf("gave up after %d attempts when the overall timeout ran out: %v", r.Attempts, j.lastErr)
	}
	j.log.Error("pull failed", "attempts", r.Attempts, "reason", r.Reason, "err", j.lastErr)
}

// attempt tries every credential, then anonymous, each with a deadline of
// the whole attempt timeout (counted from the last byte the runtime
// received when w can tell: see tryContext). Any error moves on to the next
// try: a registry may answer 401 for a missing tag, and a credential may be
// slow where the next one is not.
func (p *Puller) attempt(ctx context.Context, ref string, auths []cri.Auth, timeout time.Duration, w *progressWatch) error {
	tries := make([]*cri.Auth, 0, len(auths)+1)
	for i := range auths {
		tries = append(tries, &auths[i])
	}
	tries = append(tries, nil)
	var first, transient error
	for _, a := range tries {
		actx, cancel := tryContext(ctx, w, timeout)
		_, err := p.rt.PullImage(actx, ref, a)
		err = cutError(actx, err)
		cancel()
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
		c, reason := Classify(err)
		if reason == ReasonInsufficientDisk {
			// Another credential would only fill the disk again.
			return err
		}
		if c == Transient && transient == nil {
			transient = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	// A transient failure with any credential means a retry may succeed.
	if transient != nil {
		return transient
	}
	return first
}

// ErrNoImages is returned when a list has no entries at all.
var ErrNoImages = errors.New("the image list is empty")

// StatusParallelism bounds the ImageStatus calls made at once. They only
// read the runtime's metadata, so several at once cost little, and a stuck
// runtime then costs one call's timeout per batch rather than per image.
const StatusParallelism = 8
