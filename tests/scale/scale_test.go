package scale_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/scale"
)

func TestMain(m *testing.M) {
	// The harness re-runs this test binary for its agents processes.
	scale.MaybeRunAgents()
	os.Exit(m.Run())
}

// TestScaleSmoke is make scale's smallest run, 100 nodes with K=10 and
// metrics on, against a real apiserver, with the bounds asserted: never
// more than K holders (by the agents' account, by the Leases and by the
// nodes pulling at the registry), every node labeled succeeded, and the
// registry serving exactly the bytes the nodes need (no pull is cut off
// and restarted). Then two nodes join alone, the second with its first
// Lease list answered 503: each takes a free slot within 30 s (issue 34:
// no slot free longer while a node waits) and labels succeeded. The
// herd's times are reported, not asserted.
func TestScaleSmoke(t *testing.T) {
	cfg := scale.Config{Nodes: 100, Slots: 10, Join: true}
	opts := scale.Options{
		Configs:     []scale.Config{cfg},
		Capacity:    1000 * scale.MiB,
		NodeCap:     200 * scale.MiB,
		Parallelism: 4,
		Procs:       4,
	}
	for i := range 4 {
		opts.Images = append(opts.Images, scale.Image{Ref: fmt.Sprintf("registry.example.com/scale/image-%d:v1", i), Size: 25 * scale.MiB})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := scale.Measure(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	t.Logf("watch events per waiting node per minute: %.1f (%d events over %.0f waiting node-seconds)",
		run.WatchPerWaiterMinute(), run.WatchEvents, run.WaitingSeconds)
	t.Logf("last label %.1fs (%.2f× ideal), peak held %d/%d, waiter requests %.2f per waiting node per minute, hand-over p50 %s p99 %s (%d)",
		run.Last.Seconds(), run.Ratio(), run.PeakHeldAgents, run.PeakHeldAPI, run.PerWaiterMinute(), run.HandOverP50, run.HandOverP99, run.HandOvers)
	if run.PeakHolders() > cfg.Slots {
		t.Errorf("peak holders: %d by the agents' reports, %d Leases with a holder, %d nodes pulling; want at most K=%d", run.PeakHeldAgents, run.PeakHeldAPI, run.PeakPulling, cfg.Slots)
	}
	if run.PeakHeldAgents < 1 || run.PeakHeldAPI < 1 || run.PeakPulling < 1 {
		t.Errorf("peak holders: %d by the agents' reports, %d by the Leases, %d nodes pulling; one of them saw nothing", run.PeakHeldAgents, run.PeakHeldAPI, run.PeakPulling)
	}
	if run.Succeeded != cfg.Nodes || run.Failed != 0 || run.AgentFailures != 0 {
		t.Errorf("labels: %d succeeded, %d failed, %d agents failed; want all %d succeeded", run.Succeeded, run.Failed, run.AgentFailures, cfg.Nodes)
	}
	if len(run.Completions) != cfg.Nodes {
		t.Errorf("%d agents reported a label, want %d", len(run.Completions), cfg.Nodes)
	}
	if len(run.Joiners) != 2 || run.Joiners[0].FailedFirstList || !run.Joiners[1].FailedFirstList {
		t.Errorf("joiners %+v, want one whose first list is answered, then one whose first list fails", run.Joiners)
	}
	for _, j := range run.Joiners {
		t.Logf("lone joiner (first list failed: %t): slot held %s after its start, %d API requests, label %q", j.FailedFirstList, j.Wait, j.Requests, j.Label)
		if j.Wait > 30*time.Second || j.Label != "succeeded" {
			t.Errorf("lone joiner (first list failed: %t): slot held %s after its start, label %q; want within 30s and succeeded", j.FailedFirstList, j.Wait, j.Label)
		}
	}
	if run.Served != run.Needed {
		t.Errorf("registry served %d bytes, the nodes need %d (%.4f×); %d pulls were cancelled", run.Served, run.Needed, float64(run.Served)/float64(run.Needed), run.Cancelled)
	}
}
