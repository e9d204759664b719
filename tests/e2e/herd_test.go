package e2e_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Herd control (docs/herd.md) through the real agent, with the RBAC the
// function renders for it: the agents' only way to the Leases is the
// rendered Role, so a missing verb or name there fails these scenarios.

const (
	// herdParallelism is the instances' pull.parallelism.
	herdParallelism = 2
	// maxConcurrentDownloads is containerd's CRI max_concurrent_downloads
	// on the e2e nodes: tests/cluster leaves containerd's default of 3
	// (only StartRuntimes, for the benchmark, sets it).
	maxConcurrentDownloads = 3
	// herdBandwidth caps the registry for these scenarios, so that a pull
	// lasts seconds and transfers that could overlap do.
	herdBandwidth = 2 << 20
	// herdNodeLabel selects the nodes the herd scenarios' DaemonSets run on.
	herdNodeLabel = "e2e.image-prefetcher.io/herd"
)

// herdImages pushes one image per name with three 1.5 MiB layers (with
// the config, four blobs; containerd fetches three at a time), so that one
// node pulling herdParallelism of them at once has
// herdParallelism × maxConcurrentDownloads blob transfers open, and the
// 9 MiB per node take about 4.5 s at herdBandwidth.
func herdImages(t *testing.T, seed int64, names ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var refs []string
	for i, name := range names {
		img, err := ociimage.Data(seed+int64(i), 1536<<10, 1536<<10, 1536<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Push(ctx, img, "e2e/"+name+":v1"); err != nil {
			t.Fatalf("push e2e/%s:v1: %v", name, err)
		}
		refs = append(refs, "ghcr.io/e2e/"+name+":v1")
	}
	forgetImages(t, refs...)
	return refs
}

// capRegistry starts the scenario's registry accounting from zero (peaks
// and request log) and caps its bandwidth until the test ends.
func capRegistry(t *testing.T) *registry.Registry {
	reg := c.Registry()
	reg.ResetStats()
	reg.SetBandwidth(herdBandwidth)
	t.Cleanup(reg.ClearFaults)
	return reg
}

// setNodeLabel sets (value != "") or removes a label on a node as the admin.
func (e env) setNodeLabel(t *testing.T, node, key, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, key, v)
	if _, err := e.cs.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label %s on %s: %v", key, node, err)
	}
}

// leaseView is one Lease as a sample saw it. The times are the agents'
// own writes (renewTime, acquireTime), not the test's clock.
type leaseView struct {
	name, holder   string
	renew, acquire time.Time
	duration       time.Duration
	transitions    int32
	seeded         string
}

// herdSample is one consistent List of the namespace's Leases, with the
// registry's open blob transfers read right after it.
type herdSample struct {
	leases   []leaseView
	inflight int64
}

func (s herdSample) held() []leaseView {
	var out []leaseView
	for _, l := range s.leases {
		if l.holder != "" {
			out = append(out, l)
		}
	}
	return out
}

func (s herdSample) lease(name string) (leaseView, bool) {
	for _, l := range s.leases {
		if l.name == name {
			return l, true
		}
	}
	return leaseView{}, false
}

func (s herdSample) String() string {
	var parts []string
	for _, l := range s.leases {
		parts = append(parts, fmt.Sprintf("%s holder=%q transitions=%d seeded=%q", l.name, l.holder, l.transitions, l.seeded))
	}
	return fmt.Sprintf("[%s] blob transfers open: %d", strings.Join(parts, "; "), s.inflight)
}

// leaseSampler lists the Leases of a namespace every 100 ms until stopped.
// Every holder holds for seconds (a pull at herdBandwidth), so no holding
// falls between two samples.
type leaseSampler struct {
	mu      sync.Mutex
	samples []herdSample
	errs    int
	lastErr error
	cancel  context.CancelFunc
	done    chan struct{}
}

func (e env) sampleLeases(t *testing.T, ns string) *leaseSampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &leaseSampler{cancel: cancel, done: make(chan struct{})}
	reg := c.Registry()
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			// The slots, not the queue's tickets (docs/herd.md).
			slotsOnly := metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=pull-slot"}
			list, err := e.cs.CoordinationV1().Leases(ns).List(ctx, slotsOnly)
			inflight := reg.Stats().BlobTransfers
			s.mu.Lock()
			if err != nil {
				if ctx.Err() == nil {
					s.errs++
					s.lastErr = err
				}
			} else {
				var smp herdSample
				for _, l := range list.Items {
					v := leaseView{name: l.Name, seeded: l.Annotations[labelDomain+"seeded"]}
					if l.Spec.HolderIdentity != nil {
						v.holder = *l.Spec.HolderIdentity
					}
					if l.Spec.RenewTime != nil {
						v.renew = l.Spec.RenewTime.Time
					}
					if l.Spec.AcquireTime != nil {
						v.acquire = l.Spec.AcquireTime.Time
					}
					if l.Spec.LeaseDurationSeconds != nil {
						v.duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
					}
					if l.Spec.LeaseTransitions != nil {
						v.transitions = *l.Spec.LeaseTransitions
					}
					smp.leases = append(smp.leases, v)
				}
				sort.Slice(smp.leases, func(i, j int) bool { return smp.leases[i].name < smp.leases[j].name })
				smp.inflight = inflight
				s.samples = append(s.samples, smp)
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { s.stop() })
	return s
}

// snapshot returns the samples so far.
func (s *leaseSampler) snapshot() []herdSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]herdSample(nil), s.samples...)
}

// stop ends sampling and returns every sample.
func (s *leaseSampler) stop() []herdSample {
	s.cancel()
	<-s.done
	return s.snapshot()
}

// waitSample waits until a sample at index from or later satisfies ok, and
// returns it and its index.
func (s *leaseSampler) waitSample(t *testing.T, what string, from int, timeout time.Duration, ok func(herdSample) bool) (herdSample, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var found herdSample
	at, seen := -1, from
	if err := poll(ctx, what, func() (bool, string) {
		all := s.snapshot()
		for i := seen; i < len(all); i++ {
			if ok(all[i]) {
				found, at = all[i], i
				return true, ""
			}
		}
		seen = max(seen, len(all))
		if len(all) == 0 {
			return false, fmt.Sprintf("no sample yet (%d list errors, last %v)", s.errs, s.lastErr)
		}
		return false, all[len(all)-1].String()
	}); err != nil {
		t.Fatal(err)
	}
	return found, at
}

// holderPod is the pod of a holderIdentity, which the agent writes as
// <pod name>-<random suffix> (docs/herd.md).
func holderPod(holder string) string {
	if i := strings.LastIndex(holder, "-"); i > 0 {
		return holder[:i]
	}
	return holder
}

// Scenario 15: maxConcurrentNodes: 1 on the two nodes, behind a registry
// capped at 2 MiB/s. Each node's pull alone opens up to
// parallelism × max_concurrent_downloads = 6 blob transfers and lasts
// about 4.5 s, and both agents start within a second or two of each other:
// without the cap the two pulls overlap and the registry sees 12 transfers
// at once (measured with the same images and no maxConcurrentNodes). With it, the Leases never show more than one
// slot held and the registry never more than 6 transfers. The node that
// takes the slot first has its pod deleted with grace 0 in the middle of
// its pull (and its node taken out of the DaemonSet's nodeSelector, so
// that no replacement competes): the other node takes the slot over only
// after the lease duration has passed since the dead holder's last
// renewal. Then the first node is put back, and both end succeeded.
func Test15HerdCap(t *testing.T) {
	e := setup(t)
	refs := herdImages(t, 1500, "cap-a", "cap-b")
	for _, n := range c.Nodes() {
		e.setNodeLabel(t, n.Name, herdNodeLabel, "on")
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes() {
			e.setNodeLabel(t, n.Name, herdNodeLabel, "")
		}
	})
	const k = 1
	bound := int64(k * herdParallelism * maxConcurrentDownloads)
	reg := capRegistry(t)
	const ns = "e2e-herd-cap"
	s := e.sampleLeases(t, ns)
	spec := yamlList(refs) + fmt.Sprintf("  nodeSelector:\n    %s: \"on\"\n  pull:\n    parallelism: %d\n    maxConcurrentNodes: %d\n",
		herdNodeLabel, herdParallelism, k)
	d := e.deployInstance(t, instance{Name: "herdcap", Namespace: ns, Spec: spec})
	slot0 := d.Name + "-slot-0"

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	first, at := s.waitSample(t, "a first holder of "+slot0, 0, 2*time.Minute, func(smp herdSample) bool { return len(smp.held()) > 0 })
	victimID := first.held()[0].holder
	victimPod := holderPod(victimID)
	pod, err := e.cs.CoreV1().Pods(ns).Get(ctx, victimPod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the holder %s of %s is not a pod of the instance: %v", victimID, slot0, err)
	}
	victim := c.Node(pod.Spec.NodeName)
	var other string
	for _, n := range c.Nodes() {
		if n.Name != victim.Name {
			other = n.Name
		}
	}
	otherPod := e.podOn(t, d, other)
	// Kill it mid-pull: while it holds the slot and blob transfers are open.
	mid, _ := s.waitSample(t, "blob transfers of "+victimID, at, time.Minute, func(smp herdSample) bool {
		l, _ := smp.lease(slot0)
		return smp.inflight > 0 || l.holder != victimID
	})
	if l, _ := mid.lease(slot0); l.holder != victimID {
		t.Fatalf("%s released %s before a blob transfer was seen: %s", victimID, slot0, mid)
	}
	logf(t, "%s (on %s) holds %s and pulls (%d blob transfers open); deleting its pod with grace 0", victimID, victim.Name, slot0, mid.inflight)
	// A crash, not a termination: fetch gives its slot back on SIGTERM, and
	// both leaving the nodeSelector and a delete with grace 0 send SIGTERM
	// first. The holder is frozen (SIGSTOP) before either, so it neither
	// renews nor releases; the delete's SIGKILL ends it.
	freezeFetch(t, ctx, e, victim, ns, victimPod)
	// Out of the nodeSelector first, and seen so by the DaemonSet
	// controller, so that it does not start a replacement on that node.
	e.setNodeLabel(t, victim.Name, herdNodeLabel, "")
	if err := poll(ctx, "DaemonSet "+d.dsName()+" scheduled on one node", func() (bool, string) {
		ds, err := e.cs.AppsV1().DaemonSets(ns).Get(ctx, d.dsName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return ds.Status.DesiredNumberScheduled == 1, fmt.Sprintf("desired %d", ds.Status.DesiredNumberScheduled)
	}); err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, victimPod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}

	// The takeover, read from the Lease history: the dead holder's last
	// renewTime and the new holder's acquireTime are both written by the
	// agents, and every node's clock is this machine's.
	taken, takenAt := s.waitSample(t, otherPod+" (on "+other+") taking "+slot0, at, 2*time.Minute, func(smp herdSample) bool {
		l, _ := smp.lease(slot0)
		return l.holder != victimID && holderPod(l.holder) == otherPod
	})
	var lastRenew time.Time
	var leaseDuration time.Duration
	between := map[string]bool{}
	for _, smp := range s.snapshot()[:takenAt] {
		l, _ := smp.lease(slot0)
		if l.holder == victimID {
			lastRenew, leaseDuration = l.renew, l.duration
		} else if l.holder != "" && holderPod(l.holder) != otherPod {
			between[l.holder] = true
		}
	}
	took, _ := taken.lease(slot0)
	gap := took.acquire.Sub(lastRenew)
	logf(t, "%s took %s over %.1fs after %s's last renewal (leaseDurationSeconds %s)", took.holder, slot0, gap.Seconds(), victimID, leaseDuration)
	if leaseDuration <= 0 {
		t.Errorf("the Lease %s held by %s has no leaseDurationSeconds", slot0, victimID)
	}
	if gap < leaseDuration {
		t.Errorf("%s took %s over %.1fs after the dead holder's last renewal, before the lease duration %s", took.holder, slot0, gap.Seconds(), leaseDuration)
	}
	if len(between) > 0 {
		t.Errorf("other holders of %s before %s took it over: %v", slot0, otherPod, between)
	}
	e.waitLabel(t, d, other, "succeeded", labelWait)

	logf(t, "putting %s back into the DaemonSet's nodeSelector", victim.Name)
	e.setNodeLabel(t, victim.Name, herdNodeLabel, "on")
	e.waitLabel(t, d, victim.Name, "succeeded", labelWait)
	e.waitRolledOut(t, d, 2)
	samples := s.stop()
	assertImages(t, c.Nodes(), refs, true)

	holders := map[string]bool{}
	for _, smp := range samples {
		held := smp.held()
		if len(held) > k {
			t.Errorf("%d slots held at once, want at most %d: %s", len(held), k, smp)
		}
		for _, l := range smp.leases {
			if l.name != slot0 {
				t.Errorf("Lease %s in %s: with maxConcurrentNodes 1 the agents use %s only", l.name, ns, slot0)
			}
		}
		for _, l := range held {
			holders[l.holder] = true
		}
	}
	logf(t, "%d Lease samples; holders seen: %v", len(samples), sortedKeys(holders))
	st := reg.Stats()
	logf(t, "registry: peak %d blob transfers at once (bound %d = %d slot × parallelism %d × max_concurrent_downloads %d), %d requests, %.1f MiB",
		st.PeakBlobTransfers, bound, k, herdParallelism, maxConcurrentDownloads, st.Requests, float64(st.BytesSent)/(1<<20))
	// The scenario's premise: one node's pull alone opens more transfers
	// than it pulls images, because containerd fetches several blobs of
	// each image at once. Otherwise the bound below would prove nothing
	// about max_concurrent_downloads.
	if st.PeakBlobTransfers <= k*herdParallelism {
		t.Errorf("the registry saw at most %d blob transfers at once: the pulls did not exercise containerd's concurrent downloads", st.PeakBlobTransfers)
	}
	if st.PeakBlobTransfers > bound {
		t.Errorf("the registry saw %d blob transfers at once, more than %d slot × parallelism %d × max_concurrent_downloads %d = %d",
			st.PeakBlobTransfers, k, herdParallelism, maxConcurrentDownloads, bound)
	}
}

// Scenario 16: seedNodes: 1 with maxConcurrentNodes: 2. The first node to
// take slot 0 pulls alone; when it has finished it records that on the
// slot-0 Lease (the seeded annotation, whose value is a digest of the image
// list), and only then does the other node start. The order is read twice,
// without clocks: from the Lease history (no sample shows the second
// node's holder before the annotation) and from the registry's request
// log (the second node's first request comes after the seed's last blob).
func Test16HerdSeed(t *testing.T) {
	e := setup(t)
	refs := herdImages(t, 1600, "seed-a", "seed-b")
	reg := capRegistry(t)
	const ns = "e2e-herd-seed"
	s := e.sampleLeases(t, ns)
	spec := yamlList(refs) + fmt.Sprintf("  pull:\n    parallelism: %d\n    maxConcurrentNodes: 2\n    seedNodes: 1\n", herdParallelism)
	d := e.deployInstance(t, instance{Name: "herdseed", Namespace: ns, Spec: spec})
	slot0 := d.Name + "-slot-0"
	for _, n := range c.Nodes() {
		e.waitLabel(t, d, n.Name, "succeeded", labelWait)
	}
	e.waitRolledOut(t, d, 2)
	samples := s.stop()
	assertImages(t, c.Nodes(), refs, true)

	// The seed is the first holder seen, on slot 0.
	var seedID string
	for _, smp := range samples {
		if held := smp.held(); len(held) > 0 {
			if len(held) != 1 || held[0].name != slot0 {
				t.Fatalf("the first holding is %s, want one holder of %s", smp, slot0)
			}
			seedID = held[0].holder
			break
		}
	}
	if seedID == "" {
		t.Fatalf("no holder in %d Lease samples", len(samples))
	}
	want := listKey(t, refs)
	othersHeld := false
	for _, smp := range samples {
		l0, _ := smp.lease(slot0)
		for _, l := range smp.held() {
			if holderPod(l.holder) == holderPod(seedID) {
				continue
			}
			othersHeld = true
			if l0.seeded == "" {
				t.Errorf("%s holds %s while %s has no seeded annotation: the second node started before the seed finished: %s", l.holder, l.name, slot0, smp)
			}
		}
		if l0.seeded != "" && l0.seeded != want {
			t.Errorf("the seeded annotation on %s is %q, want %q (the image list's key)", slot0, l0.seeded, want)
		}
	}
	if !othersHeld {
		t.Errorf("no sample shows the second node holding a slot; samples: %d", len(samples))
	}
	if last, _ := samples[len(samples)-1].lease(slot0); last.seeded != want {
		t.Errorf("after both nodes finished, the seeded annotation on %s is %q, want %q", slot0, last.seeded, want)
	}

	// The registry's log is in completion order. Every request of the
	// second node repeats one of the seed's (same images, same paths), and
	// its first one, a manifest HEAD, has no body for the bandwidth cap to
	// slow, so it is logged as soon as it arrives. So if the second node
	// started only after the seed finished, the first repeated request
	// comes after the seed's last blob download.
	var reqs []registry.Request
	for _, q := range reg.Requests(registry.Match{}) {
		if strings.Contains(q.Path, "/e2e/seed-") {
			reqs = append(reqs, q)
		}
	}
	seen := map[string]int{}
	firstRepeat, lastFirstBlob := -1, -1
	for i, q := range reqs {
		key := q.Method + " " + q.Path
		seen[key]++
		if seen[key] == 2 && firstRepeat < 0 {
			firstRepeat = i
		}
		if seen[key] == 1 && q.Method == "GET" && strings.Contains(q.Path, "/blobs/") {
			lastFirstBlob = i
		}
	}
	var lines []string
	for i, q := range reqs {
		lines = append(lines, fmt.Sprintf("%2d %s %s %d %d", i, q.Method, q.Path, q.Status, q.Bytes))
	}
	logf(t, "registry log for the scenario's images (completion order):\n  %s", strings.Join(lines, "\n  "))
	switch {
	case firstRepeat < 0 || lastFirstBlob < 0:
		t.Errorf("the registry log shows no repeated request or no blob download: %d requests", len(reqs))
	case firstRepeat < lastFirstBlob:
		t.Errorf("request %d (%s %s), the second node's first, came before the seed's last blob download (request %d)",
			firstRepeat, reqs[firstRepeat].Method, reqs[firstRepeat].Path, lastFirstBlob)
	}
	for key, n := range seen {
		if strings.HasPrefix(key, "GET ") && strings.Contains(key, "/blobs/") && n != 2 {
			t.Errorf("%s: %d downloads, want 2 (one per node)", key, n)
		}
	}
}

// listKey is what the agent writes as the seeded annotation for a list:
// the first 16 hex digits of the SHA-256 of its normalized references,
// one per line, in list order (docs/herd.md, Seed mode).
func listKey(t *testing.T, refs []string) string {
	t.Helper()
	h := sha256.New()
	for _, r := range refs {
		n, err := imagelist.Normalize(r)
		if err != nil {
			t.Fatal(err)
		}
		h.Write([]byte(n + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// freezeFetch stops the fetch process of pod on node with SIGSTOP, found
// through the node's CRI: a holder that hangs, or a crash, as far as the
// Lease can tell.
func freezeFetch(t *testing.T, ctx context.Context, e env, node *cluster.Node, ns, pod string) {
	t.Helper()
	p, err := e.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, st := range p.Status.InitContainerStatuses {
		if st.Name == "fetch" {
			_, id, _ = strings.Cut(st.ContainerID, "://")
		}
	}
	if id == "" {
		t.Fatalf("pod %s has no fetch container ID: %+v", pod, p.Status.InitContainerStatuses)
	}
	cri, err := node.CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	st, err := cri.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("status of fetch of %s on %s: %v", pod, node.Name, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil || info.Pid <= 1 {
		t.Fatalf("no pid in the verbose status of fetch of %s: %v %q", pod, err, st.GetInfo()["info"])
	}
	if err := syscall.Kill(info.Pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP fetch of %s (pid %d): %v", pod, info.Pid, err)
	}
	logf(t, "froze fetch of %s on %s (pid %d)", pod, node.Name, info.Pid)
}
