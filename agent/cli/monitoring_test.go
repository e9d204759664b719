package cli

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

// TestWatchMetricsForAlerts scrapes the series the PrometheusRule's alerts
// read: succeeded and the per-image failures follow each check, and a
// change of the node key by someone else counts as a label conflict, while
// the agent's own rewrites do not.
func TestWatchMetricsForAlerts(t *testing.T) {
	e := newEnv(t)
	const ref = "docker.io/library/app:1"
	done := e.startWatch("--refresh-interval=5ms", "--metrics-addr=127.0.0.1:0", "app:1")
	addr := e.metricsAddr()
	waitFor(t, "label succeeded", e.labelIs("succeeded"))
	scrapeHas := func(what string, want map[string]float64) map[string]float64 {
		t.Helper()
		var got map[string]float64
		waitFor(t, what, func() bool {
			var err error
			got, err = scrape(addr)
			return err == nil && has(got, want)
		})
		return got
	}
	scrapeHas("succeeded", map[string]float64{`image_prefetcher_succeeded`: 1, `image_prefetcher_label_conflicts_total`: 0, `image_prefetcher_slot_waiting`: 0})

	// The image goes and cannot come back: the agent rewrites its own
	// label to failed, which is no conflict.
	e.cri.SetBehavior(ref, func(context.Context, int, *runtimeapi.PullImageRequest) error { return fakecri.NotFound(ref) })
	e.cri.DeleteImage(ref)
	waitFor(t, "label failed", e.labelIs("failed"))
	got := scrapeHas("failed", map[string]float64{
		`image_prefetcher_succeeded`: 0,
		`image_prefetcher_image_failed{image="app:1",reason="NotFound"}`: 1,
	})
	if got[`image_prefetcher_label_conflicts_total`] != 0 {
		t.Errorf("the agent's own rewrite counted as a conflict: %v", got)
	}

	// Someone else writes the key: one conflict, and the label comes back.
	patch := []byte(`{"metadata":{"labels":{"` + testKey + `":"succeeded"}}}`)
	if _, err := e.kube.CoreV1().Nodes().Patch(context.Background(), testNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	scrapeHas("a label conflict", map[string]float64{`image_prefetcher_label_conflicts_total`: 1})
	waitFor(t, "label failed again", e.labelIs("failed"))

	// Pullable again: the failure series goes away.
	e.cri.SetBehavior(ref, nil)
	waitFor(t, "label succeeded again", e.labelIs("succeeded"))
	got = scrapeHas("succeeded again", map[string]float64{`image_prefetcher_succeeded`: 1})
	for k := range got {
		if len(k) > len("image_prefetcher_image_failed{") && k[:len("image_prefetcher_image_failed{")] == "image_prefetcher_image_failed{" {
			t.Errorf("failure series left after recovery: %s", k)
		}
	}
	if got[`image_prefetcher_label_conflicts_total`] != 1 {
		t.Errorf("conflicts %v, want 1", got[`image_prefetcher_label_conflicts_total`])
	}
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
}
