package cli

import (
	"testing"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

func TestPinCell(t *testing.T) {
	for _, tc := range []struct {
		name string
		pins *label.Pins
		want string
	}{
		{"no pins reported", nil, "-"},
		{"unsupported", &label.Pins{Unsupported: "containerd 1.6.20"}, "pinning unsupported"},
		{"within the budget", &label.Pins{Images: 3, Bytes: 3 << 20, BudgetBytes: 48 << 20}, "3, 3.0 MiB of 48.0 MiB"},
		{"over the budget", &label.Pins{Images: 1, Bytes: 1 << 20, BudgetBytes: 2 << 20, NotPinned: []label.Failure{{Image: "b", Reason: "OverBudget"}}}, "1, 1.0 MiB of 2.0 MiB, 1 not pinned (OverBudget)"},
		{"budget unknown", &label.Pins{Error: "the pin budget is unknown: no mount"}, "error: the pin budget is unknown: no mount"},
		{"error after counting", &label.Pins{Images: 1, Bytes: 1 << 20, BudgetBytes: 2 << 20, Error: "pin b: deadline"}, "1, 1.0 MiB of 2.0 MiB, error: pin b: deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pinCell(&label.Summary{Pins: tc.pins}); got != tc.want {
				t.Errorf("pinCell = %q, want %q", got, tc.want)
			}
		})
	}
}
