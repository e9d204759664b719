// Package slots_test runs the cluster-wide pull cap (agent/slots) against a
// real kube-apiserver and etcd: several holders, each with its own client
// and the agent's exact RBAC, compete for K Lease slots.
package slots_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// Environment of the holder subprocess (see TestMain).
const (
	envHolder    = "SLOTS_TEST_HOLDER"
	envToken     = "SLOTS_TEST_TOKEN"
	envNamespace = "SLOTS_TEST_NAMESPACE"
	envInstance  = "SLOTS_TEST_INSTANCE"
	envSlots     = "SLOTS_TEST_SLOTS"
	envDuration  = "SLOTS_TEST_DURATION"
)

// TestMain doubles as the holder subprocess, an agent we can kill: it takes
// a slot, prints "HELD <lease> <identity>" and renews until it is killed.
func TestMain(m *testing.M) {
	if os.Getenv(envHolder) == "1" {
		os.Exit(runHolder())
	}
	os.Exit(m.Run())
}

func runHolder() int {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	cfg.BearerToken = os.Getenv(envToken)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	k, _ := strconv.Atoi(os.Getenv(envSlots))
	d, _ := time.ParseDuration(os.Getenv(envDuration))
	ns := os.Getenv(envNamespace)
	g, err := slots.New(slots.Config{
		Client: cs.CoordinationV1().Leases(ns), Namespace: ns, Instance: os.Getenv(envInstance),
		Slots: k, Identity: "subprocess", LeaseDuration: d,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	h, err := g.Hold(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	fmt.Printf("HELD %s %s\n", h.Name(), h.Identity())
	<-h.Lost()
	fmt.Fprintln(os.Stderr, "holder: lost its slot")
	return 1
}

func TestSlotsAgainstAPIServer(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns, err := c.CreateNamespace(ctx, "prefetch")
	if err != nil {
		t.Fatal(err)
	}
	env := &testEnv{c: c, admin: admin, ns: ns}

	t.Run("at most K holders at any moment", env.testAtMostK)
	t.Run("killed holder's slot is reclaimed after the lease duration", env.testKilledHolder)
	t.Run("seed nodes pull alone until one finishes", env.testSeed)
	t.Run("a slot no longer in the Lease policy is skipped", env.testLoweredK)
	t.Run("a slot the Lease policy allows only later is taken once it does", env.testRaisedK)
	t.Run("fetch on SIGTERM gives its slot back and records no seed", env.testFetchSIGTERM)
	t.Run("a take cut off by SIGTERM leaves no holder behind", env.testTerminatedTake)
	t.Run("watch waiting for a slot keeps the label truthful", env.testWatchWaitingForASlot)
	t.Run("waiting nodes send no requests while the slots are busy", env.testQuietWaiters)
	t.Run("one watch, of the node's own ticket; every released slot is taken", env.testOneWatch)
	t.Run("a Role without list and watch ends the wait with an error", env.testOldRole)
	t.Run("a take whose answer was lost is written again; never two holders", env.testLostAnswer)
	// Last: it stops the apiserver.
	t.Run("a 30 s apiserver outage: holders stop pulling, never more than K nodes pull", env.testOutage)
}

type testEnv struct {
	c     *cluster.Cluster
	admin *kubernetes.Clientset
	ns    string
}

// agentToken applies what the function renders for an instance with k
// slots (its ServiceAccount, RBAC and admission policies; not the
// DaemonSet: nothing runs it here) and returns a token of its
// ServiceAccount. The Role lets the agent write any Lease of the
// namespace; the Lease policy keeps it to the k slots and its tickets.
func (e *testEnv) agentToken(t *testing.T, instance string, k int) string {
	t.Helper()
	e.render(t, instance, k)
	return e.token(t, instance)
}

// render applies the instance as rendered for k slots, again if it was
// applied before (maxConcurrentNodes changed).
func (e *testEnv) render(t *testing.T, instance string, k int) {
	t.Helper()
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind}
	ip.Metadata.Name, ip.Metadata.Namespace = instance, e.ns
	ip.Spec.Images = []string{"registry.example.com/app:v1"}
	maxNodes := int32(k)
	ip.Spec.Pull.MaxConcurrentNodes = &maxNodes
	rc, probs := render.Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		t.Fatalf("render %s: %+v", instance, probs)
	}
	objs, err := render.Render(rc)
	if err != nil {
		t.Fatalf("render %s: %v", instance, err)
	}
	var docs []string
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			continue
		}
		s, err := o.String()
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, s)
	}
	ctx := context.Background()
	if _, err := e.c.Apply(ctx, []byte(strings.Join(docs, "---\n")), cluster.ApplyOptions{FieldManager: "image-prefetcher-fn"}); err != nil {
		t.Fatalf("apply %s: %v", instance, err)
	}
	// The apiserver loads a policy a moment after it is written: wait
	// until it refuses a Lease that is no slot and allows the last slot.
	leases := e.agentClient(t, e.token(t, instance)).CoordinationV1().Leases(e.ns)
	dryRun := func(name string) error {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
		_, err := leases.Create(ctx, l, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := cluster.Poll(ctx, 100*time.Millisecond, "the Lease policy of "+instance, func() (bool, string) {
		other, last := dryRun(instance+"-not-a-slot"), dryRun(slots.SlotName(instance, k-1))
		return apierrors.IsForbidden(other) && !apierrors.IsForbidden(last),
			fmt.Sprintf("dry-run creates: a Lease that is no slot: %v; slot %d: %v", other, k-1, last)
	}); err != nil {
		t.Fatal(err)
	}
}

// token returns a token of the instance's ServiceAccount.
func (e *testEnv) token(t *testing.T, instance string) string {
	t.Helper()
	sa := render.NamesFor(e.ns, instance).Namespaced
	tr, err := e.admin.CoreV1().ServiceAccounts(e.ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create token: %v", err)
	}
	return tr.Status.Token
}

// agentClient is a clientset acting with token.
func (e *testEnv) agentClient(t *testing.T, token string) *kubernetes.Clientset {
	t.Helper()
	rc, err := e.c.RESTConfigForToken(token)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// gate returns a Gate with its own client (own connection) and the
// agent's identity.
func (e *testEnv) gate(t *testing.T, token, instance string, cfg slots.Config) *slots.Gate {
	t.Helper()
	return e.wrappedGate(t, token, instance, cfg, nil)
}

// countedGate is gate, counting every request its client sends in calls.
func (e *testEnv) countedGate(t *testing.T, token, instance string, cfg slots.Config, calls *atomic.Int64) *slots.Gate {
	t.Helper()
	if calls == nil {
		return e.wrappedGate(t, token, instance, cfg, nil)
	}
	return e.wrappedGate(t, token, instance, cfg, func(rt http.RoundTripper, r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return rt.RoundTrip(r)
	})
}

// wrappedGate is gate, with every request its client sends going
// through roundTrip.
func (e *testEnv) wrappedGate(t *testing.T, token, instance string, cfg slots.Config, roundTrip func(http.RoundTripper, *http.Request) (*http.Response, error)) *slots.Gate {
	t.Helper()
	rc, err := e.c.RESTConfigForToken(token)
	if err != nil {
		t.Fatal(err)
	}
	if roundTrip != nil {
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) { return roundTrip(rt, r) })
		})
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = cs.CoordinationV1().Leases(e.ns)
	cfg.Namespace = e.ns
	cfg.Instance = instance
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := slots.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// heldLeases lists the instance's Leases (as admin: the agent cannot
// list) and returns the holders of those whose holder is set and whose
// renewTime is within their duration. Every Lease of the instance must be
// one of the K slot names.
func (e *testEnv) heldLeases(t *testing.T, instance string, k int) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := e.admin.CoordinationV1().Leases(e.ns).List(ctx, metav1.ListOptions{
		LabelSelector: slots.LabelInstance + "=" + instance + "," + slots.LabelComponent + "=" + slots.LabelComponentSlot})
	if err != nil {
		t.Fatalf("list Leases: %v", err)
	}
	allowed := map[string]bool{}
	for i := range k {
		allowed[slots.SlotName(instance, i)] = true
	}
	now := time.Now()
	held := map[string]string{} // lease name -> holder
	for _, l := range list.Items {
		if !allowed[l.Name] {
			t.Errorf("Lease %s is not one of the %d slot names", l.Name, k)
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
			continue
		}
		if l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).After(now) {
			held[l.Name] = *l.Spec.HolderIdentity
		}
	}
	return held
}

// holders tracks who is between Hold and Release and still counts itself
// as holder. It checks on every entry that no more than K are inside.
type holders struct {
	t   *testing.T
	k   int
	mu  sync.Mutex
	in  map[*slots.Holding]int // holding -> entry number
	n   int
	max int
}

func (hs *holders) enter(h *slots.Holding) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.n++
	hs.in[h] = hs.n
	inside := 0
	for o := range hs.in {
		// A holder that missed its renewals has stopped counting itself
		// before anyone could take its slot.
		if !lost(o) {
			inside++
		}
	}
	hs.max = max(hs.max, inside)
	if inside > hs.k {
		hs.t.Errorf("%d holders inside at once, cap is %d", inside, hs.k)
	}
}

func (hs *holders) leave(h *slots.Holding) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	delete(hs.in, h)
}

// snapshot returns who is inside, with their entry numbers.
func (hs *holders) snapshot() map[*slots.Holding]int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	s := make(map[*slots.Holding]int, len(hs.in))
	for h, n := range hs.in {
		if !lost(h) {
			s[h] = n
		}
	}
	return s
}

func (hs *holders) count() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return len(hs.in)
}

func (e *testEnv) testAtMostK(t *testing.T) {
	const (
		k        = 2
		agents   = 6
		rounds   = 4
		instance = "herd"
		duration = 3 * time.Second
	)
	token := e.agentToken(t, instance, k)
	hs := &holders{t: t, k: k, in: map[*slots.Holding]int{}}
	// The first K holders stay inside until the test has seen them in the
	// Leases and has kept the others waiting for longer than a lease
	// duration, so that the run is sure to reach the cap and to renew.
	firstPhase := make(chan struct{})
	var wg sync.WaitGroup
	for a := range agents {
		g := e.gate(t, token, instance, slots.Config{Slots: k, Identity: fmt.Sprintf("agent-%d", a), LeaseDuration: duration})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				h, err := g.Hold(ctx)
				cancel()
				if err != nil {
					t.Errorf("agent %d round %d: %v", a, r, err)
					return
				}
				hs.enter(h)
				if r == 0 {
					<-firstPhase
				}
				time.Sleep(time.Duration(20+rand.IntN(150)) * time.Millisecond) // the "pull"
				if lost(h) {
					t.Logf("agent %d lost its slot while pulling (a slow machine can do this)", a)
				}
				hs.leave(h)
				h.Release()
				time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
			}
		}()
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	// Wait for the cap to be reached; it must be, K slots are free.
	for hs.count() < k {
		select {
		case <-done:
			t.Fatal("holders ended before the cap was reached")
		case <-time.After(20 * time.Millisecond):
		}
	}
	held := e.heldLeases(t, instance, k)
	inside := hs.snapshot()
	if len(held) != k {
		t.Errorf("with %d holders inside, the Leases show %d held: %v", k, len(held), held)
	}
	for h := range inside {
		if held[h.Name()] != h.Identity() {
			t.Errorf("%s is inside but the Lease %s shows holder %q", h.Identity(), h.Name(), held[h.Name()])
		}
	}
	// Keep the waiters out for longer than a lease duration: only renewals
	// keep the slots.
	time.Sleep(2 * duration)
	close(firstPhase)

	// Sample the Leases until every agent is done. Any holder inside for
	// the whole of a sample must show in it.
	samples, maxHeld := 0, 0
	for sampling := true; sampling; {
		select {
		case <-done:
			sampling = false
		default:
		}
		before := hs.snapshot()
		held := e.heldLeases(t, instance, k)
		after := hs.snapshot()
		samples++
		maxHeld = max(maxHeld, len(held))
		if len(held) > k {
			t.Errorf("sample %d: %d Leases held, cap is %d: %v", samples, len(held), k, held)
		}
		// A holder handing its slot to the queue writes the oldest
		// ticket's holder into it before it claims the ticket; two
		// doing so at once name one ticket in two slots until the one
		// that lost the claim hands its slot on. So only the holders of
		// the agents inside count: each shows in one slot at most.
		slotsOf := map[string]int{}
		for _, id := range held {
			slotsOf[id]++
		}
		for h := range after {
			if slotsOf[h.Identity()] > 1 {
				t.Errorf("sample %d: %s holds %d slots", samples, h.Identity(), slotsOf[h.Identity()])
			}
		}
		for h, n := range before {
			if after[h] == n && held[h.Name()] != h.Identity() {
				t.Errorf("sample %d: %s was inside throughout, but Lease %s shows %q", samples, h.Identity(), h.Name(), held[h.Name()])
			}
		}
	}
	t.Logf("%d samples of the Leases; at most %d held; at most %d holders inside", samples, maxHeld, hs.max)
	if hs.max != k {
		t.Errorf("at most %d holders were inside at once, want exactly the cap %d", hs.max, k)
	}
	// Everything released: no slot is held any more.
	if held := e.heldLeases(t, instance, k); len(held) != 0 {
		t.Errorf("after every release, Leases still held: %v", held)
	}
}

func (e *testEnv) testKilledHolder(t *testing.T) {
	const (
		k        = 2
		instance = "crash"
		duration = 2 * time.Second
	)
	token := e.agentToken(t, instance, k)

	// A holds a slot in another process, B the other slot in this one.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := e.c.Command(ctx, self)
	cmd.Env = append(cmd.Env, envHolder+"=1", envToken+"="+token, envNamespace+"="+e.ns,
		envInstance+"="+instance, envSlots+"="+strconv.Itoa(k), envDuration+"="+duration.String())
	cmd.Stderr = t.Output()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder subprocess: %v", err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("holder subprocess said nothing: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "HELD" {
		t.Fatalf("holder subprocess said %q", line)
	}
	aSlot, aID := f[1], f[2]

	b := e.gate(t, token, instance, slots.Config{Slots: k, Identity: "b", LeaseDuration: duration})
	bh, err := b.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer bh.Release()
	if bh.Name() == aSlot {
		t.Fatalf("B got %s, which the subprocess holds", aSlot)
	}

	// The subprocess renews: wait until its renewTime moves on.
	leases := e.admin.CoordinationV1().Leases(e.ns)
	first, err := leases.Get(ctx, aSlot, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		l, err := leases.Get(ctx, aSlot, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if holderOf(l) != aID {
			t.Fatalf("%s: holder %q, want the subprocess %q", aSlot, holderOf(l), aID)
		}
		if l.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the subprocess never renewed its Lease")
		case <-time.After(100 * time.Millisecond):
		}
	}

	// Kill it: no release, no more renewals.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	dead, err := leases.Get(ctx, aSlot, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if holderOf(dead) != aID {
		t.Fatalf("after the kill %s shows holder %q, want %q", aSlot, holderOf(dead), aID)
	}
	lastRenew := dead.Spec.RenewTime.Time

	// C waits; the only way in is the dead holder's slot.
	cg := e.gate(t, token, instance, slots.Config{Slots: k, Identity: "c", LeaseDuration: duration})
	ch, err := cg.Hold(ctx)
	if err != nil {
		t.Fatalf("the killed holder's slot was never reclaimed: %v", err)
	}
	defer ch.Release()
	if ch.Name() != aSlot {
		t.Fatalf("C got %s, want the killed holder's %s", ch.Name(), aSlot)
	}
	got, err := leases.Get(ctx, aSlot, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if holderOf(got) != ch.Identity() {
		t.Errorf("%s holder %q, want %q", aSlot, holderOf(got), ch.Identity())
	}
	// A lower bound, true however slow the machine: not before the lease
	// duration had passed since the last renewal.
	if took := got.Spec.AcquireTime.Sub(lastRenew); took < duration {
		t.Errorf("%s reclaimed %v after the last renewal, before the lease duration %v", aSlot, took, duration)
	} else {
		t.Logf("%s reclaimed %v after the killed holder's last renewal (lease duration %v)", aSlot, took.Round(time.Millisecond), duration)
	}
	if l, err := leases.Get(ctx, bh.Name(), metav1.GetOptions{}); err != nil || holderOf(l) != bh.Identity() {
		t.Errorf("B's slot %s: %v, holder %q", bh.Name(), err, holderOf(l))
	}
}

func (e *testEnv) testSeed(t *testing.T) {
	const (
		k        = 3
		seeds    = 1
		agents   = 4
		instance = "seed"
	)
	token := e.agentToken(t, instance, k)
	type interval struct {
		seed       bool
		start, end time.Time
	}
	var mu sync.Mutex
	var intervals []interval
	var wg sync.WaitGroup
	for a := range agents {
		g := e.gate(t, token, instance, slots.Config{Slots: k, SeedNodes: seeds, SeedKey: "list-1", Identity: fmt.Sprintf("agent-%d", a), LeaseDuration: 5 * time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			h, err := g.Hold(ctx)
			if err != nil {
				t.Errorf("agent %d: %v", a, err)
				return
			}
			start := time.Now()
			time.Sleep(300 * time.Millisecond) // the "pull"
			end := time.Now()
			h.Release()
			mu.Lock()
			intervals = append(intervals, interval{h.Seed(), start, end})
			mu.Unlock()
		}()
	}
	wg.Wait()
	var firstSeedEnd time.Time
	nSeeds := 0
	for _, iv := range intervals {
		if iv.seed {
			nSeeds++
			if firstSeedEnd.IsZero() || iv.end.Before(firstSeedEnd) {
				firstSeedEnd = iv.end
			}
		}
	}
	if nSeeds != seeds {
		t.Fatalf("%d seeds, want %d", nSeeds, seeds)
	}
	for _, iv := range intervals {
		if !iv.seed && iv.start.Before(firstSeedEnd) {
			t.Errorf("a non-seed started pulling %v before the first seed finished", firstSeedEnd.Sub(iv.start))
		}
	}
	l, err := e.admin.CoordinationV1().Leases(e.ns).Get(context.Background(), slots.SlotName(instance, 0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := l.Annotations[slots.SeededAnnotation]; v != "list-1" {
		t.Errorf("slot 0 %s = %q, want list-1", slots.SeededAnnotation, v)
	}
}

// lost reports whether h has stopped counting itself as its slot's holder.
func lost(h *slots.Holding) bool {
	select {
	case <-h.Lost():
		return true
	default:
		return false
	}
}

func holderOf(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}
