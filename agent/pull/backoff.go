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
