package scale

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/metrics"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// agentsEnv, set in a process's environment, makes MaybeRunAgents run the
// agents it is given on stdin instead of returning: the harness re-runs
// its own binary that way, a few processes of many agents each.
const agentsEnv = "IMAGE_PREFETCHER_SCALE_AGENTS"

// agentsSpec is what one agents process runs, sent as the first line of
// its stdin. The second line, "go", starts every agent at once.
type agentsSpec struct {
	Host      string `json:"host"`
	CAData    []byte `json:"caData"`
	Namespace string `json:"namespace"`
	Instance  string `json:"instance"`
	Slots     int    `json:"slots"`
	SeedNodes int    `json:"seedNodes"`
	SeedKey   string `json:"seedKey"`
	// LostAnswers is the share of takes, in percent, whose answer is lost:
	// the apiserver makes the write, and the call times out.
	LostAnswers int `json:"lostAnswers"`
	// FailFirstList answers each agent's first Lease list 503 Service
	// Unavailable, as an apiserver under load answers (a lone joiner).
	FailFirstList bool      `json:"failFirstList,omitempty"`
	Images        []Image   `json:"images"`
	Socket        string    `json:"socket"`
	Agents        []agentID `json:"agents"`
	// CPUProfile, if set, receives the process's CPU profile.
	CPUProfile string `json:"cpuProfile,omitempty"`
	// Parallelism is the agent's --parallelism.
	Parallelism int `json:"parallelism"`
}

// agentID is one simulated node's agent: its node, its pod, and a token
// bound to that pod.
type agentID struct {
	Index int    `json:"index"`
	Node  string `json:"node"`
	Pod   string `json:"pod"`
	Token string `json:"token"`
}

// Image is one image of the simulated list.
type Image struct {
	Ref  string `json:"ref"`
	Size int64  `json:"size"`
}

// event is what agents report to the harness, one JSON line each, with
// the wall clock they share (all processes run on one machine). After
// "go", the harness sends the processes commands, one a line: "throttle
// on" and "throttle off" (every take is answered 429 Too Many Requests
// meanwhile, as the apiserver's flow control answers under load),
// "shrink N" (every waiting agent but the first N leaves) and "stop"
// (every agent leaves).
type event struct {
	T     int64  `json:"t"` // Unix nanoseconds
	Agent int    `json:"a"`
	Kind  string `json:"e"`
	Slot  int    `json:"s"`
	Value string `json:"v,omitempty"`
}

// Event kinds.
const (
	evReady    = "ready"    // the process is set up
	evStart    = "start"    // the agent started its fetch
	evWait     = "wait"     // Hold called
	evHold     = "hold"     // Hold returned a slot; Value is the agent's API requests until then
	evRelease  = "release"  // Release called
	evReleased = "released" // Release returned
	evLost     = "lost"     // the slot was lost while held
	evLabeled  = "labeled"  // the node label was written; Value is it
	evFailed   = "failed"   // the agent ended without a label; Value says why
	evLeft     = "left"     // the agent left (shrink, stop) without a label
	// Faults the harness made: a take answered 429, a take whose answer
	// was lost. Value is the slot's Lease.
	evThrottled  = "throttled"
	evAnswerLost = "answer-lost"
	// A Lease list the harness answered 503 (FailFirstList).
	evListFailed = "list-failed"
	// The agent ended; Value is how many events its Lease watches
	// delivered to it (watchcount.go).
	evWatched = "watched"
)

// MaybeRunAgents runs the agents process and exits when the environment
// asks for it (see agentsEnv); otherwise it returns at once. Call it first
// in main and in TestMain.
func MaybeRunAgents() {
	if os.Getenv(agentsEnv) == "" {
		return
	}
	if err := runAgents(context.Background(), os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "agents: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type emitter struct {
	mu  sync.Mutex
	w   *bufio.Writer
	enc *json.Encoder
}

func (e *emitter) emit(ev event) {
	ev.T = time.Now().UnixNano()
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev)
	if ev.Kind == evReady {
		_ = e.w.Flush()
	}
}

func (e *emitter) flush() {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.w.Flush()
}

// runAgents sets every agent up, reports ready, waits for "go", runs them
// all and returns when each has labeled its node or failed.
func runAgents(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec agentsSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("decode spec: %w", err)
	}
	if spec.CPUProfile != "" {
		f, err := os.Create(spec.CPUProfile)
		if err != nil {
			return fmt.Errorf("CPU profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	w := bufio.NewWriterSize(stdout, 1<<16)
	em := &emitter{w: w, enc: json.NewEncoder(w)}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	transfers := newTransferClient(spec.Socket)

	var b imagelist.Builder
	sizes := map[string]int64{}
	for _, img := range spec.Images {
		b.Add(0, img.Ref)
		ref, err := imagelist.KubeletRef(img.Ref)
		if err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
		sizes[ref] = img.Size
	}
	entries := b.List().Entries

	throttled := &atomic.Bool{}
	agents := make([]*simAgent, len(spec.Agents))
	for i, id := range spec.Agents {
		a, err := newSimAgent(ctx, spec, id, sizes, transfers, throttled, em, log)
		if err != nil {
			return fmt.Errorf("agent %s: %w", id.Node, err)
		}
		agents[i] = a
	}
	em.emit(event{Kind: evReady, Agent: -1})
	if _, err := in.ReadString('\n'); err != nil {
		return fmt.Errorf("wait for go: %w", err)
	}
	stopFlush := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				em.flush()
			case <-stopFlush:
				return
			}
		}
	}()
	go commands(in, agents, throttled, log)
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(func() { a.run(entries) })
	}
	wg.Wait()
	close(stopFlush)
	em.flush()
	return nil
}

// commands follows the harness's commands until stdin ends.
func commands(in *bufio.Reader, agents []*simAgent, throttled *atomic.Bool, log *slog.Logger) {
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return
		}
		var keep int
		switch line = strings.TrimSpace(line); {
		case line == "throttle on", line == "throttle off":
			throttled.Store(line == "throttle on")
		case line == "stop":
			for _, a := range agents {
				a.leave()
			}
		case strings.HasPrefix(line, "shrink "):
			if _, err := fmt.Sscanf(line, "shrink %d", &keep); err != nil {
				log.Error("bad command", "line", line)
				continue
			}
			for _, a := range agents {
				if a.waiting.Load() {
					if keep > 0 {
						keep--
					} else {
						a.leave()
					}
				}
			}
		default:
			log.Error("unknown command", "line", line)
		}
	}
}

// simAgent is the agent's fetch on one simulated node: its own API client
// and rate limiter, the real herd-control gate with metrics on, puller and
// labeler.
type simAgent struct {
	id      agentID
	em      *emitter
	puller  *pull.Puller
	labeler *label.Labeler
	log     *slog.Logger
	// ctx ends when the agent leaves; waiting is true while it waits for
	// a slot.
	ctx     context.Context
	leave   context.CancelFunc
	waiting atomic.Bool
	// requests counts the agent's API requests, those the harness
	// answered itself included.
	requests atomic.Int64
	// watchEvents counts the events the agent's Lease watches delivered.
	watchEvents atomic.Int64
}

func newSimAgent(ctx context.Context, spec agentsSpec, id agentID, sizes map[string]int64, transfers *transferClient, throttled *atomic.Bool, em *emitter, log *slog.Logger) (*simAgent, error) {
	log = log.With("node", id.Node)
	a := &simAgent{id: id, em: em, log: log}
	a.ctx, a.leave = context.WithCancel(ctx)
	// Each agent its own transport, as each pod has: a Dial of its own
	// keeps client-go from sharing one cached connection among them. QPS
	// and Burst stay unset, so the rate limiter is client-go's default,
	// as in the agent.
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	cfg := &rest.Config{
		Host:            spec.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: spec.CAData},
		BearerToken:     id.Token,
		UserAgent:       "image-prefetcher/scale",
		Dial:            dialer.DialContext,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return countingTransport{rt: rt, n: &a.requests}
		},
	}
	kc, err := kube.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	leases := faults{
		LeaseClient: kc.Leases(spec.Namespace),
		lost:        spec.LostAnswers,
		throttled:   throttled,
		emit:        a.emit,
		requests:    &a.requests,
		watchEvents: &a.watchEvents,
	}
	if spec.FailFirstList {
		leases.failList = &atomic.Bool{}
		leases.failList.Store(true)
	}
	m := metrics.New()
	gate, err := newGate(spec, id, leases, m, a, log)
	if err != nil {
		return nil, err
	}
	rt := &fakeRuntime{node: id.Node, sizes: sizes, client: transfers, present: map[string]bool{}}
	a.puller = pull.New(rt, pull.Config{
		Parallelism: spec.Parallelism,
		Policy:      v1alpha1.DefaultPullPolicy,
		Gate:        gate,
		Progress:    rt,
		Observer:    m,
		Creds:       noCreds{},
		Log:         log,
	})
	owner := label.AgentOwner(spec.Namespace, spec.Instance, id.Pod)
	a.labeler = &label.Labeler{Nodes: kc.Nodes(), Node: id.Node, Key: label.Key(v1alpha1.LabelDomain, spec.Instance), Owner: &owner, Log: log}
	return a, nil
}

func (a *simAgent) emit(kind string, slot int, value string) {
	a.em.emit(event{Agent: a.id.Index, Kind: kind, Slot: slot, Value: value})
}

// run is fetch: pull the list, then label the node with the outcome. An
// agent that left writes no label, as fetch terminated writes none.
func (a *simAgent) run(entries []imagelist.Entry) {
	a.emit(evStart, -1, "")
	defer a.reportWatched()
	start := time.Now()
	results := a.puller.Run(a.ctx, entries, "")
	if a.ctx.Err() != nil {
		a.emit(evLeft, -1, "")
		return
	}
	s := pull.Summarize(results, time.Since(start))
	if err := a.labeler.Apply(a.ctx, s); err != nil {
		a.log.Error("labeling the node failed", "err", err)
		a.emit(evFailed, -1, strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	a.emit(evLabeled, -1, s.Value())
}

// noCreds: the simulated registry needs no credentials.
type noCreds struct{}

func (noCreds) Lookup(context.Context, string) []cri.Auth { return nil }

// countingTransport counts an agent's requests to the apiserver.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(req)
}

// faults is an agent's Lease client with the harness's faults: takes
// answered 429 while throttled, takes whose answer is lost (the write is
// made, and the call times out), and a first list answered 503 (failList,
// if set, until then).
type faults struct {
	kube.LeaseClient
	lost      int
	throttled *atomic.Bool
	failList  *atomic.Bool
	requests  *atomic.Int64
	// watchEvents counts the events the agent's watches delivered.
	watchEvents *atomic.Int64
	emit        func(kind string, slot int, value string)
}

func (f faults) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if f.failList != nil && f.failList.CompareAndSwap(true, false) {
		f.requests.Add(1)
		f.emit(evListFailed, -1, "")
		return nil, apierrors.NewServiceUnavailable("the harness fails the first list")
	}
	return f.LeaseClient.List(ctx, opts)
}

func (f faults) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return f.write(ctx, l, func() (*coordinationv1.Lease, error) { return f.LeaseClient.Create(ctx, l, opts) })
}

func (f faults) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return f.write(ctx, l, func() (*coordinationv1.Lease, error) { return f.LeaseClient.Update(ctx, l, opts) })
}

func (f faults) write(ctx context.Context, l *coordinationv1.Lease, do func() (*coordinationv1.Lease, error)) (*coordinationv1.Lease, error) {
	// A take names a holder with its acquire and renew times equal; a
	// renewal moves the renew time on, a release clears the holder.
	s := l.Spec
	if s.HolderIdentity == nil || s.AcquireTime == nil || s.RenewTime == nil || !s.AcquireTime.Equal(s.RenewTime) {
		return do()
	}
	if f.throttled.Load() {
		f.emit(evThrottled, -1, l.Name)
		return nil, apierrors.NewTooManyRequests("the harness throttles takes", 1)
	}
	out, err := do()
	if err == nil && mrand.IntN(100) < f.lost {
		f.emit(evAnswerLost, -1, l.Name)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return out, err
}
