package release

import "testing"

// The output directories are removed before a release: never the tree.
func TestSafeToClear(t *testing.T) {
	tests := []struct {
		dir  string
		safe bool
	}{
		{"out/release", true},
		{"/tmp/x/release", true},
		{".", false},
		{"", false},
		{"/", false},
		{"..", false},
	}
	for _, tt := range tests {
		if err := safeToClear(tt.dir, "."); (err == nil) != tt.safe {
			t.Errorf("safeToClear(%q) = %v, want safe %v", tt.dir, err, tt.safe)
		}
	}
}
