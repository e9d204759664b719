package pull

import (
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name        string
		results     []Result
		wantValue   string
		wantPresent int
		wantReasons []string
	}{
		{"all present", []Result{{Image: "a", Present: true}, {Image: "b", Present: true}}, "succeeded", 2, nil},
		{"one failed with its reason", []Result{{Image: "a", Present: true}, {Image: "b", Reason: ReasonNotFound, Message: "not found"}}, "failed", 1, []string{ReasonNotFound}},
		{"absent without a reason is Missing", []Result{{Image: "a"}}, "failed", 0, []string{ReasonMissing}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Summarize(tt.results, time.Second)
			if s.Value() != tt.wantValue || s.Present != tt.wantPresent || s.Total != len(tt.results) {
				t.Errorf("value %q present %d total %d, want %q %d %d", s.Value(), s.Present, s.Total, tt.wantValue, tt.wantPresent, len(tt.results))
			}
			var reasons []string
			for _, f := range s.Failed {
				reasons = append(reasons, f.Reason)
			}
			if len(reasons) != len(tt.wantReasons) || (len(reasons) > 0 && reasons[0] != tt.wantReasons[0]) {
				t.Errorf("reasons %v, want %v", reasons, tt.wantReasons)
			}
		})
	}
}
