package label

import "testing"

// A summary is rewritten for the disk alone only when its story changes:
// the ceiling, the side of it, or a move of 5 points.
func TestSameDisk(t *testing.T) {
	const gib = 1 << 30
	d := func(usedGiB uint64, ceiling int) *Disk {
		return &Disk{UsedBytes: usedGiB * gib, CapacityBytes: 100 * gib, CeilingPercent: ceiling}
	}
	tests := []struct {
		name string
		a, b *Disk
		same bool
	}{
		{"both unknown", nil, nil, true},
		{"now known", nil, d(40, 80), false},
		{"a byte more", d(40, 80), &Disk{UsedBytes: 40*gib + 1, CapacityBytes: 100 * gib, CeilingPercent: 80}, true},
		{"4 points", d(40, 80), d(44, 80), true},
		{"5 points", d(40, 80), d(45, 80), false},
		{"5 points down", d(45, 80), d(40, 80), false},
		{"crossing the ceiling", d(79, 80), d(80, 80), false},
		{"another ceiling", d(40, 80), d(40, 70), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Summary{Total: 1, Present: 1, Failed: []Failure{}, Disk: tt.a}
			o := s
			o.Disk = tt.b
			if got := s.Same(o); got != tt.same {
				t.Errorf("Same = %v, want %v", got, tt.same)
			}
		})
	}
	if p := d(40, 80).Percent(); p != 40 {
		t.Errorf("Percent = %d, want 40", p)
	}
}
