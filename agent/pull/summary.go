package pull

import (
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// Summarize turns a run's results into what the node's label and
// annotation say: the images present, and each missing one with its
// reason (Missing when the run gave none).
func Summarize(results []Result, d time.Duration) label.Summary {
	present := 0
	var failures []label.Failure
	for _, r := range results {
		if r.Present {
			present++
			continue
		}
		reason := r.Reason
		if reason == "" {
			reason = ReasonMissing
		}
		failures = append(failures, label.Failure{Image: r.Image, Reason: reason, Message: r.Message})
	}
	return label.NewSummary(len(results), present, failures, d, time.Now())
}
