package pull

import "time"

// Doubling returns d doubled, capped at max (max <= 0 means no cap).
func Doubling(d, max time.Duration) time.Duration {
	n := 2 * d
	if max > 0 && n > max {
		return max
	}
	return n
}

// Jitter spreads d by ±20%; r is a uniform number in [0,1).
func Jitter(d time.Duration, r float64) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*r))
}

// Schedule lists the first n values of a doubling sequence, without jitter.
// It documents, and lets tests pin down, how attempt timeouts and delays grow.
func Schedule(initial, max time.Duration, n int) []time.Duration {
	out := make([]time.Duration, 0, n)
	d := initial
	for range n {
		out = append(out, d)
		d = Doubling(d, max)
	}
	return out
}
