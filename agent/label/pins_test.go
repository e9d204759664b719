package label

import (
	"strings"
	"testing"
	"time"
)

// A change of what is pinned makes the annotation stale; an error's text
// alone does not.
func TestSamePins(t *testing.T) {
	base := func(p *Pins) Summary {
		s := NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
		s.SetPins(p)
		return s
	}
	pins := &Pins{Images: 1, Bytes: 10, BudgetBytes: 100}
	tests := []struct {
		name string
		a, b *Pins
		same bool
	}{
		{"both off", nil, nil, true},
		{"off and on", nil, pins, false},
		{"equal", pins, &Pins{Images: 1, Bytes: 10, BudgetBytes: 100}, true},
		{"more bytes", pins, &Pins{Images: 1, Bytes: 11, BudgetBytes: 100}, false},
		{"other budget", pins, &Pins{Images: 1, Bytes: 10, BudgetBytes: 90}, false},
		{"not pinned", pins, &Pins{Images: 1, Bytes: 10, BudgetBytes: 100, NotPinned: []Failure{{Image: "x", Reason: "OverBudget"}}}, false},
		{"unsupported", pins, &Pins{Unsupported: "cri-o"}, false},
		{"error texts differ", &Pins{Error: "a"}, &Pins{Error: "b"}, true},
		{"error appears", &Pins{}, &Pins{Error: "b"}, false},
	}
	for _, tt := range tests {
		if got := base(tt.a).Same(base(tt.b)); got != tt.same {
			t.Errorf("%s: Same = %v, want %v", tt.name, got, tt.same)
		}
	}
}

// The images not pinned are listed up to MaxFailures, and fewer when the
// annotation would outgrow its bound.
func TestSetPinsBounded(t *testing.T) {
	var p Pins
	for range MaxFailures + 5 {
		p.NotPin(strings.Repeat("i", 2*maxImage), "OverBudget", strings.Repeat("m", 2*maxMessage))
	}
	if len(p.NotPinned) != MaxFailures || p.OmittedNotPinned != 5 {
		t.Fatalf("%d listed, %d omitted", len(p.NotPinned), p.OmittedNotPinned)
	}
	s := NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
	s.SetPins(&p)
	if n := len(s.Marshal()); n > MaxAnnotationBytes {
		t.Errorf("annotation %d bytes, above %d", n, MaxAnnotationBytes)
	}
	if got := len(s.Pins.NotPinned) + s.Pins.OmittedNotPinned; got != MaxFailures+5 {
		t.Errorf("%d images accounted for, want %d", got, MaxFailures+5)
	}
	if len(p.NotPinned) != MaxFailures {
		t.Error("SetPins changed its argument")
	}
}
