package pull

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

func TestDoubling(t *testing.T) {
	s := time.Second
	tests := []struct {
		name   string
		d, max time.Duration
		want   time.Duration
	}{
		{name: "doubles", d: 30 * s, max: 5 * time.Minute, want: 60 * s},
		{name: "reaches the cap exactly", d: 150 * s, max: 5 * time.Minute, want: 5 * time.Minute},
		{name: "capped", d: 240 * s, max: 5 * time.Minute, want: 5 * time.Minute},
		{name: "stays at the cap", d: 5 * time.Minute, max: 5 * time.Minute, want: 5 * time.Minute},
		{name: "no cap", d: 40 * time.Minute, max: 0, want: 80 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Doubling(tt.d, tt.max); got != tt.want {
				t.Errorf("Doubling(%v, %v) = %v, want %v", tt.d, tt.max, got, tt.want)
			}
		})
	}
}

func TestJitterStaysWithinTwentyPercent(t *testing.T) {
	for _, r := range []float64{0, 0.25, 0.5, 0.75, 0.999999} {
		d := Jitter(10*time.Second, r)
		if d < 8*time.Second || d > 12*time.Second {
			t.Errorf("Jitter(10s, %v) = %v", r, d)
		}
	}
	if Jitter(10*time.Second, 0) != 8*time.Second || Jitter(10*time.Second, 0.5) != 10*time.Second {
		t.Error("jitter is not centred on the nominal delay")
	}
}

// TestRetrySchedule drives settle, which pullAll calls after every attempt,
// through a run of transient failures, and reads the timeout each attempt
// gets and the delay before the next one: what production does, not a
// helper of its own.
func TestRetrySchedule(t *testing.T) {
	s := time.Second
	m := time.Minute
	tests := []struct {
		name string
		cfg  Config
		// timeouts are those of attempts 1, 2, ...
		timeouts []time.Duration
		// delays are the nominal delays after attempts 1, 2, ...; the wait
		// is within ±20% of each. The cap applies to the nominal delay.
		delays []time.Duration
	}{
		{"fetch defaults", Config{InitialAttemptTimeout: 30 * s, MaxAttemptTimeout: 5 * m, InitialDelay: s, MaxDelay: 10 * m},
			[]time.Duration{30 * s, 60 * s, 120 * s, 240 * s, 300 * s, 300 * s, 300 * s},
			[]time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 64 * s}},
		{"small caps", Config{InitialAttemptTimeout: 30 * s, MaxAttemptTimeout: 45 * s, InitialDelay: s, MaxDelay: 5 * s},
			[]time.Duration{30 * s, 45 * s, 45 * s, 45 * s, 45 * s},
			[]time.Duration{s, 2 * s, 4 * s, 5 * s, 5 * s}},
		// A maximum below the initial value is raised to it.
		{"cap below the initial value", Config{InitialAttemptTimeout: 30 * s, MaxAttemptTimeout: 10 * s, InitialDelay: 2 * s, MaxDelay: s},
			[]time.Duration{30 * s, 30 * s, 30 * s},
			[]time.Duration{2 * s, 2 * s, 2 * s}},
	}
	// 0 and 0.5 give exactly 80% and 100% of the nominal delay.
	rands := []float64{0, 0.5, 0.999999, 0.25}
	exact := map[float64]float64{0: 0.8, 0.5: 1}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Creds, cfg.Log = noCreds{}, discard
			i := 0
			cfg.Rand = func() float64 { r := rands[i%len(rands)]; i++; return r }
			p := New(nil, cfg)
			j := p.newJob(&Result{Normalized: "registry.example.com/app:1"})
			ref := j.r.Normalized
			for k := range tt.timeouts {
				if j.attemptTimeout != tt.timeouts[k] {
					t.Errorf("attempt %d: timeout %v, want %v", k+1, j.attemptTimeout, tt.timeouts[k])
				}
				j.r.Attempts++
				r := rands[k%len(rands)]
				wait, retry := p.settle(context.Background(), attemptDone{j: j, err: fakecri.HTTPStatus(ref, "registry.example.com", "503 Service Unavailable")})
				if !retry {
					t.Fatalf("attempt %d: a transient error was given up on", k+1)
				}
				nominal := tt.delays[k]
				if wait < nominal*8/10 || wait > nominal*12/10 {
					t.Errorf("attempt %d: wait %v, want %v ±20%%", k+1, wait, nominal)
				}
				if f, ok := exact[r]; ok && wait != time.Duration(float64(nominal)*f) {
					t.Errorf("attempt %d: wait %v with jitter %v, want %v", k+1, wait, r, time.Duration(float64(nominal)*f))
				}
			}
		})
	}
}

// A permanent error is retried on the same schedule, PermanentAttempts
// attempts in all.
func TestRetryScheduleOfPermanentErrors(t *testing.T) {
	p := New(nil, Config{InitialAttemptTimeout: 30 * time.Second, MaxAttemptTimeout: 5 * time.Minute, InitialDelay: time.Second, MaxDelay: 10 * time.Minute,
		Creds: noCreds{}, Log: discard, Rand: func() float64 { return 0.5 }})
	j := p.newJob(&Result{Normalized: "docker.io/library/typo:1"})
	var timeouts, waits []time.Duration
	for {
		timeouts = append(timeouts, j.attemptTimeout)
		j.r.Attempts++
		wait, retry := p.settle(context.Background(), attemptDone{j: j, err: fakecri.NotFound(j.r.Normalized)})
		if !retry {
			break
		}
		waits = append(waits, wait)
	}
	if got := fmt.Sprint(timeouts, waits); got != "[30s 1m0s 2m0s] [1s 2s]" || j.r.Reason != ReasonNotFound {
		t.Errorf("timeouts and waits %s, reason %q; want [30s 1m0s 2m0s] [1s 2s], NotFound", got, j.r.Reason)
	}
}
