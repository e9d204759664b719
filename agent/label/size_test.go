package label

import (
	"strings"
	"testing"
	"time"

	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// A very long invalid reference (passed as an argument) or many long
// messages must not make the annotation patch Invalid: the apiserver caps
// all of a node's annotations together at 256 KiB, and a rejected patch
// leaves the node without a label.
func TestSummaryStaysUnderTheAnnotationLimit(t *testing.T) {
	huge := strings.Repeat("x", 300<<10)
	tests := []struct {
		name     string
		failures []Failure
	}{
		{"one huge image reference", []Failure{{Image: huge, Reason: "InvalidReference", Message: "invalid reference format: " + huge}}},
		{"many long references", func() []Failure {
			var fs []Failure
			for i := range 100 {
				fs = append(fs, Failure{Image: strings.Repeat(string(rune('a'+i%26)), 20<<10), Reason: "InvalidReference", Message: strings.Repeat("m", 20<<10)})
			}
			return fs
		}()},
		{"multi-byte", []Failure{{Image: strings.Repeat("€", 100<<10), Reason: "InvalidReference", Message: strings.Repeat("😀", 100<<10)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSummary(len(tt.failures)+1, 1, tt.failures, time.Second, time.Now())
			v := s.Marshal()
			if len(v) > MaxAnnotationBytes {
				t.Errorf("annotation is %d bytes, want at most %d", len(v), MaxAnnotationBytes)
			}
			if s.FailureCount() != len(tt.failures) || s.Value() != "failed" {
				t.Errorf("%d failures counted (%d listed), want %d; value %s", s.FailureCount(), len(s.Failed), len(tt.failures), s.Value())
			}
			if len(s.Failed) == 0 || !strings.HasPrefix(tt.failures[0].Image, strings.TrimSuffix(s.Failed[0].Image, "...")) {
				t.Errorf("the first failure is not listed, or its image is not a prefix of the reference")
			}
			back, err := Parse(v)
			if err != nil || !back.Same(s) {
				t.Errorf("does not round-trip: %v", err)
			}
			// The apiserver's own check, with a node's usual other
			// annotations and this key's label and annotation on it.
			ann := map[string]string{
				"node.alpha.kubernetes.io/ttl":                           "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
				"image-prefetcher.stackrox.io/demo":                      v,
			}
			if errs := apivalidation.ValidateAnnotations(ann, field.NewPath("metadata", "annotations")); len(errs) > 0 {
				t.Errorf("the apiserver would reject the node: %v", errs.ToAggregate())
			}
		})
	}
}
