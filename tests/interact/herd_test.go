package interact_test

import (
	"bufio"
	"context"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// holding is one node's time with the pull slot, from its agent's log: from
// "acquired pull slot" to the first of "lost the pull slot; stopped
// pulling" (its pulls cancelled), "released pull slot" or "could not
// release pull slot" (its pulls over); end is zero while it still holds.
type holding struct {
	node, holder string
	start, end   time.Time
}

var holderField = regexp.MustCompile(` holder=(\S+)`)

// holdings reads the slot holdings of every pod of the instance from its
// fetch container's log (text format: time=... msg="...").
func holdings(t *testing.T, in *instance) []holding {
	t.Helper()
	var out []holding
	for _, p := range podsOf(t, in) {
		open := -1
		sc := bufio.NewScanner(strings.NewReader(podLog(t, p, "fetch")))
		for sc.Scan() {
			line := sc.Text()
			at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(strings.Fields(line + " ")[0], "time="))
			if err != nil {
				continue
			}
			switch {
			case strings.Contains(line, `msg="acquired pull slot"`):
				h := holding{node: p.Spec.NodeName, start: at}
				if m := holderField.FindStringSubmatch(line); m != nil {
					h.holder = m[1]
				}
				out = append(out, h)
				open = len(out) - 1
			case open >= 0 && (strings.Contains(line, `msg="lost the pull slot; stopped pulling`) ||
				strings.Contains(line, `msg="released pull slot"`) || strings.Contains(line, `msg="could not release pull slot`)):
				out[open].end, open = at, -1
			}
		}
	}
	return out
}

// podLog is the log of a container of p.
func podLog(t *testing.T, p corev1.Pod, container string) string {
	t.Helper()
	raw, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("log of %s/%s: %v", p.Name, container, err)
	}
	return string(raw)
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

// waitLease waits, on a watch of the Lease, until cond holds, and returns
// it.
func waitLease(t *testing.T, ns, name, what string, timeout time.Duration, cond func(*coordinationv1.Lease) bool) *coordinationv1.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(cs.CoordinationV1().RESTClient(), "leases", ns, fields.OneTermEqualSelector("metadata.name", name))
	l, err := until(ctx, lw, &coordinationv1.Lease{}, cond)
	if err != nil {
		dumpPods(t, ns)
		t.Fatalf("waiting for %s (Lease %s/%s): %v", what, ns, name, err)
	}
	return l
}

func leaseHolder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// Herd control with metrics on, maxConcurrentNodes 1, two nodes, through
// an apiserver outage longer than a slot's lease: the holder cannot renew,
// and must stop pulling before the lease runs out, when the other node may
// take the slot. With metrics on, the gate used to hide the slot's loss:
// the holder pulled on through the outage, and both nodes pulled at once
// once the apiserver was back (issue 26, finding 5).
//
// The Lease says who held the slot when the outage began; the agents' own
// logs say when each node held it and stopped pulling. The holder must
// have stopped within the lease of the outage's start, before the slot
// was taken again after it, and no two nodes may ever have held it at
// once, through to both nodes' labels. (The Lease cannot tell the rest:
// the takes after the outage last well under a second, and a watch that
// resumed across the restart, from the version it last saw, missed them.)
//
// It stops the apiserver, so it runs alone, after the other cases.
func herdWithMetricsThroughAnAPIOutage(t *testing.T) {
	const outage = 20 * time.Second // longer than the lease
	img, err := ociimage.Data(2660, 1<<20, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := c.Push(ctx, img, "interact/herd:v1"); err != nil {
		t.Fatal(err)
	}
	// About 60 s for the 3 MiB: had the holder pulled on, it would still
	// be pulling when the outage took its slot away, and when the slot was
	// taken again after it.
	c.Registry().Throttle(registry.Match{Repo: "interact/herd"}, 50<<10)
	t.Cleanup(c.Registry().ClearFaults)
	in := deploy(t, &instance{name: "herd", namespace: "interact-herd", forceRemove: true, spec: images("ghcr.io/interact/herd:v1") + pinBudget +
		"  pull:\n    maxConcurrentNodes: 1\n    initialAttemptTimeout: 5m\n  metrics:\n    enabled: true\n"})
	lease := waitLease(t, in.namespace, slots.SlotName(in.name, 0), "a node holding the slot", 2*time.Minute, func(l *coordinationv1.Lease) bool {
		return leaseHolder(l) != ""
	})
	t.Logf("%s holds the slot; stopping the apiserver for %v", leaseHolder(lease), outage)
	if err := c.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// The holder's last renewal was written before this.
	stopped := time.Now()
	select { // the fault lasts a fixed time: that is what is tested
	case <-time.After(outage):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	// The registry throttles a transfer for its whole life: a node that
	// pulled on through the outage still pulls slowly, while every pull
	// started with a slot taken after the outage goes at full speed.
	c.Registry().ClearFaults()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range c.Nodes() {
		waitNode(t, nodeName(i), "labeled", 2*time.Minute, func(n *corev1.Node) (bool, string) {
			return n.Labels[in.key()] == "succeeded", keyState(n, in.key(), "")
		})
	}

	hs := holdings(t, in)
	var holder, retaken *holding
	for i, h := range hs {
		t.Logf("%s (%s) held the slot from %s to %s", h.node, h.holder, h.start.Format("15:04:05.000"), h.end.Format("15:04:05.000"))
		if holder == nil && h.holder == leaseHolder(lease) {
			holder = &hs[i]
		}
		if h.start.After(stopped) && (retaken == nil || h.start.Before(retaken.start)) {
			retaken = &hs[i]
		}
	}
	switch {
	case holder == nil:
		t.Errorf("no agent log says it acquired the slot as %s, its holder when the outage began", leaseHolder(lease))
	case retaken == nil:
		t.Errorf("no agent log says the slot was taken after the outage, though %s was cut off and both nodes are labeled", holder.node)
	case holder.end.IsZero() || !holder.end.Before(stopped.Add(slots.DefaultLeaseDuration)):
		t.Errorf("%s went on pulling %v into the outage, past the lease, when the other node may take the slot", holder.node, slots.DefaultLeaseDuration)
	case !holder.end.Before(retaken.start):
		t.Errorf("%s still pulled when %s took the slot after the outage", holder.node, retaken.node)
	}
	if n := mostAtOnce(hs); n > 1 {
		t.Errorf("%d nodes held the slot at once with maxConcurrentNodes 1", n)
	}
}
