package disk

import (
	"fmt"
	"strings"
)

// Ceiling is how full, in percent, the image filesystem may get from
// pulling: no pull starts at or above it.
type Ceiling struct {
	Percent int
}

// Limit is the ceiling in bytes used on a filesystem of that capacity.
func (c Ceiling) Limit(capacity uint64) uint64 {
	return capacity / 100 * uint64(c.Percent)
}

// Reached reports whether u is at or above the ceiling. An unknown
// capacity reaches nothing: the runtime's own "no space left on device"
// is then the only stop.
func (c Ceiling) Reached(u Usage) bool {
	return u.Known() && u.UsedBytes() >= c.Limit(u.CapacityBytes)
}

// Check returns a *FullError when u is at or above the ceiling.
func (c Ceiling) Check(u Usage) error {
	if !c.Reached(u) {
		return nil
	}
	return &FullError{Usage: u, Ceiling: c}
}

func (c Ceiling) describe(u Usage) string {
	if !u.Known() {
		return fmt.Sprintf("ceiling %d%%", c.Percent)
	}
	return fmt.Sprintf("ceiling %d%% (%s)", c.Percent, Bytes(c.Limit(u.CapacityBytes)))
}

// FullError says that pulling must stop: the image filesystem is at or
// above the ceiling, would be there before the next look, or the runtime
// ran out of space. Its message carries the usage, the capacity and the
// ceiling, for the node's annotation.
type FullError struct {
	Usage   Usage
	Ceiling Ceiling
	// Projected: the ceiling is not reached yet, but the rate of the last
	// looks reaches it before the next one.
	Projected bool
	// Cause is the runtime's error when it ran out of space.
	Cause error
}

func (e *FullError) Error() string {
	var b strings.Builder
	switch {
	case e.Cause != nil:
		b.WriteString("no space left on the image filesystem; ")
	case e.Projected:
		b.WriteString("the image filesystem was about to reach its ceiling at the rate it was filling; ")
	default:
		b.WriteString("the image filesystem is at or above its ceiling; ")
	}
	fmt.Fprintf(&b, "%s, %s", e.Usage, e.Ceiling.describe(e.Usage))
	if e.Cause != nil {
		fmt.Fprintf(&b, ": %v", e.Cause)
	}
	return b.String()
}

func (e *FullError) Unwrap() error { return e.Cause }
