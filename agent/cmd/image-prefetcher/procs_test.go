package main

import "testing"

// TestProcs: the cap applies to many-core nodes and yields to a GOMAXPROCS
// the environment sets (docs/agent.md, Footprint).
func TestProcs(t *testing.T) {
	tests := []struct {
		env     string
		current int
		want    int
	}{
		{"", 64, maxProcs},
		{"", 1, 1},
		{"", maxProcs, maxProcs},
		{"8", 8, 8},
		{"64", 64, 64},
	}
	for _, tt := range tests {
		if got := procs(tt.env, tt.current); got != tt.want {
			t.Errorf("procs(%q, %d) = %d, want %d", tt.env, tt.current, got, tt.want)
		}
	}
}
