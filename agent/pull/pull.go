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

// Gate limits how many nodes pull at the same time. Acquire is called once
// per run, only when at least one image really needs pulling, and release
// is called when pulling is done.
type Gate interface {
	Acquire(ctx context.Context) (release func(), err error)
}

// NoGate lets every node pull at once.
type NoGate struct{}

// Acquire returns immediately.
func (NoGate) Acquire(context.Context) (func(), error) { return func() {}, nil }

// Observer receives measurements, for metrics.
type Observer interface {
	Attempt(class Class)
	Pulled(image string, d time.Duration, bytes uint64)
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
	// PermanentAttempts caps the attempts for an image whose errors are
	// permanent (not found, unauthorized, ...).
	PermanentAttempts int

	Gate     Gate
	Creds    Credentials
	Observer Observer
	Log      *slog.Logger
	// Sleep waits between attempts; tests replace it to run without delays.
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
	if c.Gate == nil {
		c.Gate = NoGate{}
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
	// Normalized is the kubelet's form, used for every CRI call.
	Normalized string
	Present    bool
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
}

// New returns a Puller.
func New(rt Runtime, cfg Config) *Puller {
	cfg.defaults()
	return &Puller{rt: rt, cfg: cfg}
}

// Run makes every valid entry present, following policy (the configured one
// when empty), and returns one result per entry in list order. It returns an
// error only when ctx ends before the gate could be acquired.
func (p *Puller) Run(ctx context.Context, entries []imagelist.Entry, policy v1alpha1.PullPolicy) []Result {
	if policy == "" {
		policy = p.cfg.Policy
	}
	results := make([]Result, len(entries))
	var todo []int
	for i, e := range entries {
		r := Result{Image: e.Ref, Normalized: e.Normalized}
		if e.Err != nil {
			r.Reason, r.Message = ReasonInvalidReference, e.Err.Error()
			results[i] = r
			continue
		}
		results[i] = r
		if p.needsPull(ctx, &results[i], policy) {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return results
	}
	release, err := p.cfg.Gate.Acquire(ctx)
	if err != nil {
		for _, i := range todo {
			results[i].Reason, results[i].Message = ReasonTimeout, fmt.Sprintf("waiting for a pull slot: %v", err)
		}
		return results
	}
	defer release()

	pctx, cancel := context.WithTimeout(ctx, p.cfg.OverallTimeout)
	defer cancel()
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(p.cfg.Parallelism, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				p.pullOne(pctx, &results[i])
			}
		}()
	}
	for _, i := range todo {
		work <- i
	}
	close(work)
	wg.Wait()
	return results
}

// needsPull applies the pull policy. A present image under IfNotPresent
// costs one ImageStatus call and no registry traffic.
func (p *Puller) needsPull(ctx context.Context, r *Result, policy v1alpha1.PullPolicy) bool {
	switch policy {
	case v1alpha1.PullAlways:
		return true
	case v1alpha1.PullKubelet:
		if imagelist.PullAlways(r.Normalized) {
			return true
		}
	}
	info, err := p.rt.ImageStatus(ctx, r.Normalized)
	if err != nil {
		p.cfg.Log.Warn("image status failed; pulling", "image", r.Normalized, "err", err)
		return true
	}
	if info == nil {
		return true
	}
	r.Present, r.Bytes = true, info.Size
	p.cfg.Log.Debug("image present", "image", r.Normalized)
	return false
}

func (p *Puller) pullOne(ctx context.Context, r *Result) {
	log := p.cfg.Log.With("image", r.Normalized)
	start := time.Now()
	auths := p.cfg.Creds.Lookup(ctx, r.Normalized)
	attemptTimeout := p.cfg.InitialAttemptTimeout
	delay := p.cfg.InitialDelay
	permanent := 0
	var lastErr error
	var lastReason string
	for {
		r.Attempts++
		err := p.attempt(ctx, r.Normalized, auths, attemptTimeout)
		if err == nil {
			r.Present, r.Pulled, r.Reason, r.Message = true, true, "", ""
			r.Duration = time.Since(start)
			if info, serr := p.rt.ImageStatus(ctx, r.Normalized); serr == nil && info != nil {
				r.Bytes = info.Size
			}
			p.cfg.Observer.Attempt("success")
			p.cfg.Observer.Pulled(r.Normalized, r.Duration, r.Bytes)
			log.Info("pulled", "attempts", r.Attempts, "duration", r.Duration.Round(time.Millisecond), "bytes", r.Bytes)
			return
		}
		class, reason := Classify(err)
		p.cfg.Observer.Attempt(class)
		lastErr, lastReason = err, reason
		if ctx.Err() != nil {
			break
		}
		if class == Permanent {
			permanent++
			if permanent >= p.cfg.PermanentAttempts {
				break
			}
		}
		wait := Jitter(delay, p.cfg.Rand())
		log.Warn("pull attempt failed", "attempt", r.Attempts, "class", class, "reason", reason, "retryIn", wait.Round(time.Millisecond), "err", err)
		if p.cfg.Sleep(ctx, wait) != nil {
			break
		}
		delay = Doubling(delay, p.cfg.MaxDelay)
		attemptTimeout = Doubling(attemptTimeout, p.cfg.MaxAttemptTimeout)
	}
	r.Duration = time.Since(start)
	r.Reason, r.Message = lastReason, lastErr.Error()
	if ctx.Err() != nil && lastReason != ReasonNotFound && lastReason != ReasonUnauthorized && lastReason != ReasonForbidden {
		r.Reason = ReasonTimeout
		r.Message = fmt.Sprintf("gave up after %d attempts when the overall timeout ran out: %v", r.Attempts, lastErr)
	}
	log.Error("pull failed", "attempts", r.Attempts, "reason", r.Reason, "err", lastErr)
}

// attempt tries every credential, then anonymous, each with its own
// deadline. A registry may answer 401 for a missing tag, so a credential
// error moves on to the next credential instead of ending the attempt.
func (p *Puller) attempt(ctx context.Context, ref string, auths []cri.Auth, timeout time.Duration) error {
	tries := make([]*cri.Auth, 0, len(auths)+1)
	for i := range auths {
		tries = append(tries, &auths[i])
	}
	tries = append(tries, nil)
	var first, transient error
	for _, a := range tries {
		actx, cancel := context.WithTimeout(ctx, timeout)
		_, err := p.rt.PullImage(actx, ref, a)
		cancel()
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
		if c, _ := Classify(err); c == Transient && transient == nil {
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
