package slots_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/metrics"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// slotGate is the slots' gate as the puller sees it, as the agent's own
// adapter (agent/cli) makes it.
type slotGate struct{ *slots.Gate }

func (g slotGate) Hold(ctx context.Context) (pull.Slot, error) {
	h, err := g.Gate.Hold(ctx)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// pullers tracks how many nodes have a PullImage call in flight.
type pullers struct {
	mu        sync.Mutex
	pulling   map[string]int // node -> calls in flight
	max       int
	cancelled map[string]int
	release   chan struct{}
}

func (p *pullers) nodes() int {
	n := 0
	for _, c := range p.pulling {
		if c > 0 {
			n++
		}
	}
	return n
}

// nodeRuntime is one node's runtime: every pull stalls until the test
// releases them, as a big image on a slow registry does.
type nodeRuntime struct {
	node    string
	p       *pullers
	mu      sync.Mutex
	present map[string]bool
}

func (r *nodeRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.present[ref] {
		return &cri.ImageInfo{ID: ref}, nil
	}
	return nil, nil
}

func (r *nodeRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	p := r.p
	p.mu.Lock()
	p.pulling[r.node]++
	p.max = max(p.max, p.nodes())
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.pulling[r.node]--
		p.mu.Unlock()
	}()
	select {
	case <-p.release:
		r.mu.Lock()
		r.present[ref] = true
		r.mu.Unlock()
		return ref, nil
	case <-ctx.Done():
		p.mu.Lock()
		p.cancelled[r.node]++
		p.mu.Unlock()
		return "", ctx.Err()
	}
}

type noCreds struct{}

func (noCreds) Lookup(context.Context, string) []cri.Auth { return nil }

// testOutage: K = 2, three nodes, each with the real puller behind the
// agent's own gate with metrics on (metrics wraps the slots' gate). Two
// hold a slot and pull; the third waits. The apiserver goes away for 30 s,
// far longer than the lease: the holders cannot renew, stop counting
// themselves after two thirds of the lease and stop pulling, before the
// waiter could take a slot a full lease after it last saw a renewal. No
// moment has more than K nodes pulling, and every node ends with its
// image.
func (e *testEnv) testOutage(t *testing.T) {
	const (
		k        = 2
		instance = "outage"
		duration = 3 * time.Second
		outage   = 30 * time.Second
	)
	token := e.agentToken(t, instance, k)
	p := &pullers{pulling: map[string]int{}, cancelled: map[string]int{}, release: make(chan struct{})}
	var b imagelist.Builder
	b.Add(0, "ghcr.io/team/big:1")
	list := b.List().Entries
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	results := make(chan []pull.Result, 3)
	run := func(node string) {
		g := e.gate(t, token, instance, slots.Config{Slots: k, Identity: node, LeaseDuration: duration})
		rt := &nodeRuntime{node: node, p: p, present: map[string]bool{}}
		pl := pull.New(rt, pull.Config{Gate: metrics.New().Gate(slotGate{g}), Creds: noCreds{}, OverallTimeout: 2 * time.Minute,
			Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", node)})
		go func() { results <- pl.Run(ctx, list, "") }()
	}
	waitFor := func(what string, cond func(p *pullers) bool) {
		t.Helper()
		for {
			p.mu.Lock()
			ok := cond(p)
			p.mu.Unlock()
			if ok {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	run("a")
	run("b")
	waitFor("two nodes pulling", func(p *pullers) bool { return p.nodes() == k })
	run("c")
	stopped := time.Now()
	if err := e.c.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("the holders to stop pulling", func(p *pullers) bool { return p.nodes() == 0 })
	t.Logf("the holders stopped pulling %v into the outage", time.Since(stopped).Round(time.Millisecond))
	select {
	case <-time.After(time.Until(stopped.Add(outage))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := e.c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("two nodes pulling after the outage", func(p *pullers) bool { return p.nodes() == k })
	close(p.release)
	for range 3 {
		for _, r := range <-results {
			if !r.Present {
				t.Errorf("%+v, want present", r)
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.max > k {
		t.Errorf("%d nodes pulled at once with K = %d across the outage", p.max, k)
	}
	if p.cancelled["a"] == 0 || p.cancelled["b"] == 0 {
		t.Errorf("cancelled pulls per node %v: a holder that could not renew went on pulling", p.cancelled)
	}
	t.Logf("cancelled pulls per node: %v; most nodes pulling at once: %d", p.cancelled, p.max)
}

// testLostAnswer: the answer to a node's take is lost (the apiserver made
// the write, and the call hangs until its timeout). Once the call gave up,
// the node finds the slot naming that take and writes it again under a
// holder of its own: it holds only from a write it knows it sent.
// Meanwhile the other node waits. Never two holders.
func (e *testEnv) testLostAnswer(t *testing.T) {
	const instance = "lost-answer"
	token := e.agentToken(t, instance, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	dropped, lostHolder := false, "" // the holder the lost write named
	var lostEnd error                // how its call ended
	// Closed when the write's answer reaches the node (and is dropped).
	// The watch event of that write may come first, so Hold can return
	// before it.
	answered := make(chan struct{})
	a := e.wrappedGate(t, token, instance, slots.Config{Slots: 1, Identity: "a", LeaseDuration: 2 * time.Second},
		func(rt http.RoundTripper, r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			mu.Lock()
			write := err == nil && !dropped && (r.Method == http.MethodPut || r.Method == http.MethodPost)
			lose := false
			if write {
				// A take writes a slot; the queue's ticket is a Lease too.
				body, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				resp.Body = io.NopCloser(bytes.NewReader(body))
				obj, _, derr := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
				l, ok := obj.(*coordinationv1.Lease)
				if rerr != nil || derr != nil || !ok {
					t.Errorf("the answer to %s %s: %v %v", r.Method, r.URL.Path, rerr, derr)
				}
				lose = ok && strings.HasPrefix(l.Name, instance+"-slot-")
				if lose {
					dropped = true
					lostHolder = holderOf(l)
					close(answered)
				}
			}
			mu.Unlock()
			if !lose {
				return resp, err
			}
			<-r.Context().Done() // the answer is lost: the call hangs
			mu.Lock()
			lostEnd = r.Context().Err()
			mu.Unlock()
			return nil, r.Context().Err()
		})
	h, err := a.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.admin.CoordinationV1().Leases(e.ns).Get(ctx, h.Name(), metav1.GetOptions{})
	if err != nil || holderOf(l) != h.Identity() {
		t.Fatalf("Lease %s: holder %q (%v), want %q", h.Name(), holderOf(l), err, h.Identity())
	}
	select {
	case <-answered:
	case <-ctx.Done():
		t.Fatal("the take's write was never answered")
	}
	mu.Lock()
	if lostHolder == "" || lostHolder == h.Identity() || lostEnd == nil {
		t.Errorf("the lost write named %q, its call ended with %v; the node holds under %q: want a holder written again after the call gave up",
			lostHolder, lostEnd, h.Identity())
	}
	mu.Unlock()
	bg := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "b", LeaseDuration: 2 * time.Second})
	got := make(chan *slots.Holding, 1)
	go func() {
		if h, err := bg.Hold(ctx); err == nil {
			got <- h
		}
	}()
	select {
	case <-got:
		t.Fatal("another node took the slot while the first held it")
	case <-time.After(3 * time.Second): // longer than the lease: renewals keep it
	}
	h.Release()
	select {
	case b := <-got:
		b.Release()
	case <-ctx.Done():
		t.Fatal("the slot was never handed over")
	}
}
