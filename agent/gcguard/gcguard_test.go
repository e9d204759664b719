package gcguard

import (
	"testing"
	"time"
)

func TestGuard(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const img = "docker.io/library/app:1"
	type step struct {
		at time.Duration // after t0
		// "removed" (the watcher), "missing" (a check), "seen", "wiped", "pulled",
		// "held?", or "restart" (a new pod, from the annotation's records).
		do      string
		want    bool          // Removed's, Missing's or Held's answer
		wantFor time.Duration // for held: until - t0
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a one-off removal is repaired", []step{
			{0, "removed", false, 0}, {0, "held?", false, 0}, {time.Second, "pulled", false, 0},
		}},
		{"removed again after the re-pull: held 1 h", []step{
			{0, "removed", false, 0}, {time.Second, "pulled", false, 0},
			{5 * time.Minute, "removed", true, 0}, {6 * time.Minute, "held?", true, 65 * time.Minute},
			{65 * time.Minute, "held?", false, 0},
		}},
		{"the hold doubles at each further removal", []step{
			{0, "removed", false, 0}, {0, "pulled", false, 0},
			{time.Minute, "removed", true, 0},
			{61 * time.Minute, "pulled", false, 0}, {66 * time.Minute, "removed", true, 0},
			{67 * time.Minute, "held?", true, 186 * time.Minute},
		}},
		{"removed twice without a pull between: a one-off still", []step{
			{0, "removed", false, 0}, {time.Minute, "removed", false, 0}, {time.Minute, "held?", false, 0},
		}},
		{"a pull with no removal before changes nothing", []step{
			{0, "pulled", false, 0}, {time.Minute, "removed", false, 0},
		}},
		// Issue 48: the repair after one image's removal found this one
		// missing before the watcher reported it, and pulled it again.
		{"a check that finds it missing counts the removal, once", []step{
			{0, "seen", false, 0}, {0, "missing", false, 0}, {time.Second, "removed", false, 0},
			{time.Second, "pulled", false, 0},
			{5 * time.Minute, "missing", true, 0}, {5 * time.Minute, "removed", true, 0},
			{6 * time.Minute, "held?", true, 65 * time.Minute},
		}},
		{"a wipe is a one-off, even when a check finds it missing", []step{
			{0, "removed", false, 0}, {time.Second, "pulled", false, 0},
			{time.Minute, "wiped", false, 0}, {time.Minute, "missing", false, 0},
		}},
		{"an image never seen present is no removal when missing", []step{
			{0, "missing", false, 0}, {0, "pulled", false, 0}, {time.Minute, "removed", false, 0},
		}},
		// Issue 48, finding 7: a new pod holds what the last one held, and
		// knows what it pulled back.
		{"a new pod keeps the hold", []step{
			{0, "removed", false, 0}, {time.Second, "pulled", false, 0},
			{5 * time.Minute, "removed", true, 0}, {6 * time.Minute, "restart", false, 0},
			{7 * time.Minute, "held?", true, 65 * time.Minute}, {8 * time.Minute, "missing", true, 0},
			{8 * time.Minute, "held?", true, 65 * time.Minute},
		}},
		{"a new pod knows the image was pulled back", []step{
			{0, "removed", false, 0}, {time.Second, "pulled", false, 0}, {time.Minute, "restart", false, 0},
			{time.Minute, "seen", false, 0}, {5 * time.Minute, "removed", true, 0},
		}},
		{"removed while no pod ran: the new pod's check counts it", []step{
			{0, "removed", false, 0}, {time.Second, "pulled", false, 0}, {time.Minute, "restart", false, 0},
			{5 * time.Minute, "missing", true, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &Guard{}
			for i, s := range tt.steps {
				at := t0.Add(s.at)
				switch s.do {
				case "removed":
					if got := g.Removed(img, at); got != s.want {
						t.Errorf("step %d: Removed = %v, want %v", i, got, s.want)
					}
				case "missing":
					if _, got := g.Missing(img, at); got != s.want {
						t.Errorf("step %d: Missing = %v, want %v", i, got, s.want)
					}
				case "seen":
					g.Seen(img)
				case "wiped":
					g.Wiped(img)
				case "restart":
					recs := g.Records()
					g = &Guard{}
					g.Restore(recs, func(string) bool { return true })
				case "pulled":
					g.Pulled(img)
				case "held?":
					h, got := g.Held(img, at)
					if got != s.want || got && h.Until.Sub(t0) != s.wantFor {
						t.Errorf("step %d: Held = %+v %v, want %v until t0+%v", i, h, got, s.want, s.wantFor)
					}
					if n := g.HeldCount(at); n != map[bool]int{true: 1}[s.want] {
						t.Errorf("step %d: HeldCount %d", i, n)
					}
				}
			}
		})
	}
}
