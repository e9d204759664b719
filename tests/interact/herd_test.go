package interact_test

import (
	"bufio"
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// holding is one node's time holding the pull slot, from its agent's log:
// from "acquired pull slot" to "lost the pull slot" or "released pull
// slot"; end is zero while it still holds.
type holding struct {
	node       string
	start, end time.Time
}

// holdings reads the slot holdings of every pod of the instance from its
// fetch container's log (text format: time=... msg="...").
func holdings(t *testing.T, in *instance) []holding {
	t.Helper()
	var out []holding
	for _, p := range podsOf(t, in) {
		raw, err := cs.CoreV1().Pods(in.namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "fetch"}).DoRaw(context.Background())
		if err != nil {
			t.Fatalf("logs of %s: %v", p.Name, err)
		}
		var open *holding
		sc := bufio.NewScanner(strings.NewReader(string(raw)))
		for sc.Scan() {
			line := sc.Text()
			at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(strings.Fields(line + " ")[0], "time="))
			if err != nil {
				continue
			}
			switch {
			case strings.Contains(line, `msg="acquired pull slot"`):
				out = append(out, holding{node: p.Spec.NodeName, start: at})
				open = &out[len(out)-1]
			case open != nil && (strings.Contains(line, `msg="lost the pull slot`) || strings.Contains(line, `msg="released pull slot"`)):
				open.end, open = at, nil
			}
		}
	}
	return out
}

// mostAtOnce is the most holdings open at one moment.
func mostAtOnce(hs []holding) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, h := range hs {
		edges = append(edges, edge{h.start, 1})
		if !h.end.IsZero() {
			edges = append(edges, edge{h.end, -1})
		}
	}
	// At equal times an end comes first: a hand-over is not an overlap.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].at.Before(edges[j].at)
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// Herd control with metrics on, maxConcurrentNodes 1, two nodes, through
// an apiserver outage longer than a slot's lease (15 s): the holder cannot
// renew, and must stop pulling before the lease runs out, when the other
// node may take the slot. With metrics on, the gate used to hide the
// slot's loss, the holder pulled on, and two nodes pulled at once once the
// apiserver was back (issue 26, finding 5). The agents' own logs tell when
// each held the slot: the holder let it go within the lease, and never
// did two hold it at once.
//
// It stops the apiserver, so it runs alone, after the other cases: the
// kubelets and controllers take a while to catch up after an outage.
func herdWithMetricsThroughAnAPIOutage(t *testing.T) {
	const (
		outage = 20 * time.Second // longer than the lease
		lease  = 15 * time.Second // agent/slots' lease duration
	)
	img, err := ociimage.Data(2660, 1<<20, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := c.Push(ctx, img, "interact/herd:v1"); err != nil {
		t.Fatal(err)
	}
	// About 30 s for the 3 MiB: the holder is still pulling when the
	// outage takes its slot away.
	c.Registry().Throttle(registry.Match{Repo: "interact/herd"}, 100<<10)
	t.Cleanup(c.Registry().ClearFaults)
	in := deploy(t, &instance{name: "herd", namespace: "interact-herd", forceRemove: true, spec: images("ghcr.io/interact/herd:v1") +
		"  pull:\n    maxConcurrentNodes: 1\n    initialAttemptTimeout: 5m\n  metrics:\n    enabled: true\n"})
	if err := cluster.Poll(ctx, 200*time.Millisecond, "a node holding the slot", func() (bool, string) {
		l, err := cs.CoordinationV1().Leases(in.namespace).Get(ctx, "herd-slot-0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", "no holder"
	}); err != nil {
		dumpPods(t, in.namespace)
		t.Fatal(err)
	}
	t.Logf("stopping the apiserver for %v", outage)
	if err := c.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// The holder's last renewal came before this: it logged the slot's
	// acquisition after writing it.
	stopped := time.Now()
	select { // the fault lasts a fixed time: that is what is tested
	case <-time.After(outage):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	hs := holdings(t, in)
	var holder *holding
	for i, h := range hs {
		t.Logf("%s held the slot from %s to %s", h.node, h.start.Format("15:04:05.000"), h.end.Format("15:04:05.000"))
		if h.start.Before(stopped) && (h.end.IsZero() || h.end.After(stopped)) {
			holder = &hs[i]
		}
	}
	switch {
	case holder == nil:
		dumpPods(t, in.namespace)
		t.Fatal("no node held the slot when the outage began")
	case holder.end.IsZero() || !holder.end.Before(stopped.Add(lease)):
		t.Errorf("%s went on holding the slot %v into the outage, past the lease, when the other node may take it", holder.node, lease)
	}
	if n := mostAtOnce(hs); n > 1 {
		t.Errorf("%d nodes held the slot at once with maxConcurrentNodes 1", n)
	}
}
