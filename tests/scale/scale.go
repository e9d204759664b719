// Package scale measures herd control at up to 1,000 nodes: a real
// kube-apiserver and etcd, Node objects without kubelets, and on each
// simulated node the agent's own herd-control, pull and labeling code
// (agent/slots, agent/pull, agent/label) with its own pod identity and API
// client. Many agents share a few processes; their runtimes are fakes
// whose pulls take the time a shared registry bandwidth gives them. It
// reports numbers and asserts nothing about time.
package scale

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// Config is one measured run.
type Config struct {
	Nodes     int
	Slots     int
	SeedNodes int
	// Faults, faultAt after the agents start. Outage stops the apiserver
	// that long; the run then pulls slowly (every node's link at the set ÷
	// slowPull, so that holders still pull when their slots are lost) and
	// ends cutAfter the outage, when the nodes that took the slots after
	// it have had the time of one pull: it measures the cap and the
	// recovery, not the last label.
	// Throttle answers every take 429 Too Many Requests that long, as the
	// apiserver's flow control does under load. LostAnswers is the share
	// of takes, in percent, whose answer is lost all run long: the write is
	// made, and the call times out. Shrink makes every waiting node but
	// that many leave.
	Outage, Throttle time.Duration
	LostAnswers      int
	Shrink           int
	// Join: once the herd is done (every node labeled, every slot free),
	// one more node joins alone, then another whose first Lease list is
	// answered 503 (joiners.go). The herd's part of the run is the same.
	Join bool `json:",omitempty"`
}

const (
	faultAt  = 20 * time.Second
	slowPull = 2 * time.Minute
	cutAfter = slowPull + 30*time.Second
)

// Name is a short name such as n1000-k10-seed1 or n1000-k10-outage30s.
func (c Config) Name() string {
	s := fmt.Sprintf("n%d-k%d", c.Nodes, c.Slots)
	if c.SeedNodes > 0 {
		s += fmt.Sprintf("-seed%d", c.SeedNodes)
	}
	if c.Outage > 0 {
		s += "-outage" + c.Outage.String()
	}
	if c.Throttle > 0 {
		s += "-throttle" + c.Throttle.String()
	}
	if c.LostAnswers > 0 {
		s += fmt.Sprintf("-lost%d", c.LostAnswers)
	}
	if c.Shrink > 0 {
		s += fmt.Sprintf("-shrink%d", c.Shrink)
	}
	if c.Join {
		s += "-join"
	}
	return s
}

// allNodes counts the herd and the joiners: the Nodes and identities the
// run needs.
func (c Config) allNodes() int {
	if c.Join {
		return c.Nodes + len(joinerKinds)
	}
	return c.Nodes
}

// Faulty says whether the run has a fault.
func (c Config) Faulty() bool {
	return c.Outage > 0 || c.Throttle > 0 || c.LostAnswers > 0 || c.Shrink > 0
}

// Options say what to measure.
type Options struct {
	Configs []Config
	// Images is the list every node pulls.
	Images []Image
	// Capacity is the registry's bandwidth, NodeCap each node's, in bytes
	// per second.
	Capacity, NodeCap int64
	// PullSeconds, if set, is the range each node's whole pull time is
	// drawn from uniformly (its link: the set ÷ that time, under NodeCap):
	// real sets take tens of seconds to minutes a node, and with pulls of
	// about a second every tenth of a second of hand-over showed.
	PullSeconds [2]float64
	// Parallelism is the agent's --parallelism.
	Parallelism int
	// Procs is the number of agents processes.
	Procs int
	// ScrapeEvery is the pause between two scrapes of the apiserver's
	// /metrics; 0 picks one from the ideal time of each run.
	ScrapeEvery time.Duration
	// Progress receives progress lines. Default os.Stderr.
	Progress io.Writer `json:"-"`
	// KeepLogs, if set, receives the agents' and the apiserver's logs.
	KeepLogs string
	// CPUProfiles, if set, receives a CPU profile of every agents process
	// (<run>-<process>.pprof; read with go tool pprof and the harness's
	// binary): where the agents' time goes.
	CPUProfiles string
}

const (
	namespace = "image-prefetcher-scale"
	instance  = "scale"
	podPrefix = "agent-"
)

// SetBytes is the size of the whole list.
func (o Options) SetBytes() int64 {
	var n int64
	for _, img := range o.Images {
		n += img.Size
	}
	return n
}

// Ideal is the time the last node could be labeled at the earliest: every
// node's bytes through the registry at full capacity, after the seed
// nodes, which pull alone, capped by their own links.
func (o Options) Ideal(c Config) time.Duration {
	set := float64(o.SetBytes())
	secs := float64(c.Nodes) * set / float64(o.Capacity)
	if c.SeedNodes > 0 && c.SeedNodes < c.Slots {
		seeds := min(c.SeedNodes, c.Nodes)
		solo := set / float64(min(o.Capacity, int64(seeds)*o.NodeCap))
		secs = solo + float64(c.Nodes-seeds)*set/float64(o.Capacity)
	}
	if p := o.PullSeconds; p[1] > 0 { // K nodes at a time, each for the mean pull
		secs = max(secs, float64(c.Nodes)*(p[0]+p[1])/2/float64(min(c.Slots, c.Nodes)))
	}
	return time.Duration(secs * float64(time.Second))
}

// pullCaps draws each node's link from PullSeconds, the same for a node
// in every run (seeded by its index), so that before and after runs see
// the same spread.
func (o Options) pullCaps(nodes int) map[string]float64 {
	p := o.PullSeconds
	if p[1] <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(34, 0))
	caps := map[string]float64{}
	for i := range nodes {
		caps[cluster.NodeName(i)] = float64(o.SetBytes()) / (p[0] + rng.Float64()*(p[1]-p[0]))
	}
	return caps
}

type harness struct {
	opts     Options
	c        *cluster.Cluster
	cs       *kubernetes.Clientset
	cfg      *rest.Config
	ids      []cluster.PodIdentity
	bw       *Bandwidth
	socket   string
	dir      string
	start    time.Time
	labeledN int // nodes that may carry a label from an earlier run
	hb       heartbeats
}

func (h *harness) progress(format string, args ...any) {
	fmt.Fprintf(h.opts.Progress, ">> scale [%6.1fs] %s\n", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

// Measure brings up the control plane, creates the nodes and their
// agents' identities, measures every configuration and tears down.
func Measure(ctx context.Context, opts Options) (rep *Report, err error) {
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	if len(opts.Configs) == 0 || len(opts.Images) == 0 || opts.Capacity <= 0 || opts.NodeCap <= 0 {
		return nil, errors.New("scale: need configs, images, capacity and node cap")
	}
	opts.Parallelism = max(opts.Parallelism, 1)
	opts.Procs = max(opts.Procs, 1)
	h := &harness{opts: opts, start: time.Now()}
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 0, Progress: opts.Progress})
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	h.c = c
	defer func() {
		if opts.KeepLogs != "" {
			if err := errors.Join(copyDir(filepath.Join(c.Dir, "logs"), opts.KeepLogs), copyDir(h.dir, filepath.Join(opts.KeepLogs, "agents"))); err != nil {
				h.progress("keeping logs: %v", err)
			}
		}
		serr := c.Stop(context.WithoutCancel(ctx))
		if left := c.Leftovers(); len(left) > 0 {
			serr = errors.Join(serr, fmt.Errorf("teardown left behind: %s", strings.Join(left, "; ")))
		}
		err = errors.Join(err, serr)
	}()
	h.dir = filepath.Join(c.Dir, "scale")
	if err := os.MkdirAll(h.dir, 0o755); err != nil {
		return nil, err
	}
	if h.cs, err = c.Clientset(); err != nil {
		return nil, err
	}
	if h.cfg, err = c.RESTConfig(); err != nil {
		return nil, err
	}
	if err := rest.LoadTLSFiles(h.cfg); err != nil {
		return nil, fmt.Errorf("load the cluster CA: %w", err)
	}
	// setup starts the node heartbeats, which run until Measure returns.
	hctx, stopBeats := context.WithCancel(ctx)
	defer stopBeats()
	if err := h.setup(hctx); err != nil {
		return nil, err
	}
	h.bw = NewBandwidth(opts.Capacity, opts.NodeCap)
	maxN := 0
	for _, c := range opts.Configs {
		maxN = max(maxN, c.allNodes())
	}
	h.bw.SetNodeCaps(opts.pullCaps(maxN))
	h.socket = filepath.Join(h.dir, "registry.sock")
	l, err := net.Listen("unix", h.socket)
	if err != nil {
		return nil, err
	}
	srv := h.bw.Serve(l)
	defer srv.Close()

	rep = &Report{Options: opts}
	for _, cfg := range opts.Configs {
		run, err := h.run(ctx, cfg)
		if err != nil {
			return rep, fmt.Errorf("run %s: %w", cfg.Name(), err)
		}
		rep.Runs = append(rep.Runs, *run)
	}
	return rep, nil
}

// setup creates the namespace, the Node objects with their heartbeats
// (which run until ctx ends), and for every node a pod of the instance's
// ServiceAccount on it with a token bound to that pod.
func (h *harness) setup(ctx context.Context) error {
	maxN := 0
	for _, c := range h.opts.Configs {
		maxN = max(maxN, c.allNodes())
	}
	if _, err := h.c.CreateNamespace(ctx, namespace); err != nil {
		return err
	}
	// The ServiceAccount comes with the rendered objects.
	if err := h.apply(ctx, h.opts.Configs[0]); err != nil {
		return err
	}
	names := make([]string, maxN)
	for i := range names {
		names[i] = cluster.NodeName(i)
	}
	t := time.Now()
	if err := h.c.CreateNodes(ctx, names, map[string]string{"kubernetes.io/os": "linux"}, 16); err != nil {
		return err
	}
	h.progress("created %d Nodes in %.1fs", maxN, time.Since(t).Seconds())
	if err := h.hb.start(ctx, h.cfg, names); err != nil {
		return err
	}
	t = time.Now()
	sa := render.NamesFor(namespace, instance).Namespaced
	ids, err := h.c.PodIdentities(ctx, namespace, sa, podPrefix, names, 4*time.Hour, 16)
	if err != nil {
		return err
	}
	h.ids = ids
	h.progress("created %d agent pods and their pod-bound tokens in %.1fs", maxN, time.Since(t).Seconds())
	return nil
}

// apply renders the instance for cfg with the function's Go API (what the
// KRM function outputs) and applies all of it: the ServiceAccount, the
// RBAC for K slots, the admission policy that checks every label patch,
// and the DaemonSet, which nothing runs (there is no controller manager).
func (h *harness) apply(ctx context.Context, cfg Config) error {
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind}
	ip.Metadata.Name, ip.Metadata.Namespace = instance, namespace
	for _, img := range h.opts.Images {
		ip.Spec.Images = append(ip.Spec.Images, img.Ref)
	}
	k, seed := int32(cfg.Slots), int32(cfg.SeedNodes)
	ip.Spec.Pull.MaxConcurrentNodes = &k
	if seed > 0 {
		ip.Spec.Pull.SeedNodes = &seed
	}
	rc, probs := render.Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		return fmt.Errorf("render %s: %+v", cfg.Name(), probs)
	}
	objs, err := render.Render(rc)
	if err != nil {
		return fmt.Errorf("render %s: %w", cfg.Name(), err)
	}
	var docs []string
	for _, o := range objs {
		s, err := o.String()
		if err != nil {
			return err
		}
		docs = append(docs, s)
	}
	_, err = h.c.Apply(ctx, []byte(strings.Join(docs, "---\n")), cluster.ApplyOptions{FieldManager: "image-prefetcher-fn"})
	return err
}

// slotSelector selects the instance's slot Leases, not its queue's tickets.
var slotSelector = slots.LabelInstance + "=" + instance + "," + slots.LabelComponent + "=" + slots.LabelComponentSlot

// reset removes what an earlier run left: the slot Leases (and the seed
// record on slot 0) and the label and annotation on its nodes.
func (h *harness) reset(ctx context.Context) error {
	sel := slots.LabelInstance + "=" + instance
	if err := h.cs.CoordinationV1().Leases(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err != nil {
		return fmt.Errorf("delete slot leases: %w", err)
	}
	key := v1alpha1.NodeKey(instance)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{key: nil}, "annotations": map[string]any{key: nil},
	}})
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range h.labeledN {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := h.cs.CoreV1().Nodes().Patch(ctx, h.ids[i].Node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("clear label on %s: %w", h.ids[i].Node, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	h.labeledN = 0
	return errors.Join(errs...)
}

// agentsProc is one process of agents.
type agentsProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan struct{}
	events []event
	done   chan struct{}
	err    error
}

func (h *harness) startProcs(ctx context.Context, cfg Config, logDir string) ([]*agentsProc, error) {
	var procs []*agentsProc
	per := (cfg.Nodes + h.opts.Procs - 1) / h.opts.Procs
	for p := 0; p*per < cfg.Nodes; p++ {
		spec := h.spec(cfg)
		for i := p * per; i < min((p+1)*per, cfg.Nodes); i++ {
			id := h.ids[i]
			spec.Agents = append(spec.Agents, agentID{Index: i, Node: id.Node, Pod: id.Pod, Token: id.Token})
		}
		if h.opts.CPUProfiles != "" {
			spec.CPUProfile = filepath.Join(h.opts.CPUProfiles, fmt.Sprintf("%s-%d.pprof", cfg.Name(), p))
		}
		ap, err := h.startProc(ctx, spec, filepath.Join(logDir, fmt.Sprintf("agents-%d.log", p)))
		if ap != nil {
			procs = append(procs, ap)
		}
		if err != nil {
			return procs, err
		}
	}
	return procs, nil
}

// spec is what every agents process of cfg runs, but its agents.
func (h *harness) spec(cfg Config) agentsSpec {
	return agentsSpec{
		Host: h.cfg.Host, CAData: h.cfg.TLSClientConfig.CAData, Namespace: namespace, Instance: instance,
		Slots: cfg.Slots, SeedNodes: cfg.SeedNodes, SeedKey: cfg.Name(), LostAnswers: cfg.LostAnswers,
		Images: h.opts.Images, Socket: h.socket, Parallelism: h.opts.Parallelism,
	}
}

// startProc starts one agents process of spec, logging to logPath. Its
// agents start on "go".
func (h *harness) startProc(ctx context.Context, spec agentsSpec, logPath string) (*agentsProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	line, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	// In the cluster's network namespace, where the apiserver listens;
	// the registry's unix socket is reachable from any.
	cmd := h.c.Command(ctx, exe)
	cmd.Env = append(cmd.Env, agentsEnv+"=1")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start agents process: %w", err)
	}
	ap := &agentsProc{cmd: cmd, stdin: stdin, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer logf.Close()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		readied := false
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				continue
			}
			if ev.Kind == evReady && !readied {
				readied = true
				close(ap.ready)
				continue
			}
			ap.events = append(ap.events, ev)
		}
		ap.err = cmd.Wait()
		if !readied {
			close(ap.ready)
		}
		close(ap.done)
	}()
	if _, err := stdin.Write(append(line, '\n')); err != nil {
		return ap, fmt.Errorf("send spec: %w", err)
	}
	return ap, nil
}

// leaseWatch follows the instance's slot Leases from the API and keeps the
// largest number held at once, and how long each write took to reach it.
type leaseWatch struct {
	mu       sync.Mutex
	holders  map[string]string
	peak     int
	errs     []string
	restarts int
	seen     []propagation
}

// propagation is a write seen by the watch at at, d after its writer
// stamped renewTime just before sending it (one machine, one clock): the
// write's own latency and the watch's delivery, as a waiting node sees it.
type propagation struct {
	at time.Time
	d  time.Duration
}

func (lw *leaseWatch) run(ctx context.Context, cs kubernetes.Interface) error {
	w, err := lw.list(ctx, cs)
	if err != nil {
		return err
	}
	go func() {
		for {
			lw.follow(ctx, w)
			if ctx.Err() != nil {
				return // stopped: what ends the watch then is no error
			}
			// An apiserver under load ends the watches of slow readers;
			// listing again loses nothing: a list is a sample of its own.
			lw.mu.Lock()
			lw.restarts++
			lw.mu.Unlock()
			for {
				if w, err = lw.list(ctx, cs); err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return nil
}

// list samples the Leases and starts a watch from there. A watch from
// "now" needs the apiserver's watch cache to catch up with etcd, which
// etcd 3.4 cannot confirm (504 "Too large resource version"): watch from
// a list's resourceVersion, as informers do.
func (lw *leaseWatch) list(ctx context.Context, cs kubernetes.Interface) (watch.Interface, error) {
	opts := metav1.ListOptions{LabelSelector: slotSelector}
	list, err := cs.CoordinationV1().Leases(namespace).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	lw.mu.Lock()
	clear(lw.holders)
	for _, l := range list.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			lw.holders[l.Name] = *l.Spec.HolderIdentity
		}
	}
	lw.peak = max(lw.peak, len(lw.holders))
	lw.mu.Unlock()
	opts.ResourceVersion = list.ResourceVersion
	return cs.CoordinationV1().Leases(namespace).Watch(ctx, opts)
}

func (lw *leaseWatch) follow(ctx context.Context, w watch.Interface) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ctx.Err() != nil {
			return
		}
		l, ok := ev.Object.(*coordinationv1.Lease)
		if !ok {
			if ev.Type != watch.Error {
				lw.mu.Lock()
				lw.errs = append(lw.errs, fmt.Sprintf("%s %T %v", ev.Type, ev.Object, ev.Object))
				lw.mu.Unlock()
			}
			continue
		}
		lw.mu.Lock()
		if now := time.Now(); ev.Type == watch.Modified && l.Spec.RenewTime != nil {
			lw.seen = append(lw.seen, propagation{now, now.Sub(l.Spec.RenewTime.Time)})
		}
		if ev.Type == watch.Deleted || l.Spec.HolderIdentity == nil {
			delete(lw.holders, l.Name)
		} else if *l.Spec.HolderIdentity != "" {
			lw.holders[l.Name] = *l.Spec.HolderIdentity
		} else {
			delete(lw.holders, l.Name)
		}
		lw.peak = max(lw.peak, len(lw.holders))
		lw.mu.Unlock()
	}
}

// Restarts is how often the apiserver ended the watch during the run.
func (lw *leaseWatch) Restarts() int {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.restarts
}

// Errors are the watch's error events.
func (lw *leaseWatch) Errors() []string {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.errs
}

// Propagation is the median and 99th percentile of the writes seen between from and to.
func (lw *leaseWatch) Propagation(from, to time.Time) (p50, p99 time.Duration) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	var ds []time.Duration
	for _, p := range lw.seen {
		if !p.at.Before(from) && p.at.Before(to) {
			ds = append(ds, p.d)
		}
	}
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return percentile(ds, 0.50), percentile(ds, 0.99)
}

// Peak is the most Leases seen naming a holder at once.
func (lw *leaseWatch) Peak() int {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.peak
}

// run measures one configuration.
func (h *harness) run(ctx context.Context, cfg Config) (*Run, error) {
	h.progress("%s: preparing (%d nodes, K=%d, seed %d)", cfg.Name(), cfg.Nodes, cfg.Slots, cfg.SeedNodes)
	if err := h.reset(ctx); err != nil {
		return nil, err
	}
	if err := h.apply(ctx, cfg); err != nil {
		return nil, err
	}
	if err := h.bw.Reset(); err != nil {
		return nil, err
	}
	logDir := filepath.Join(h.dir, cfg.Name())
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	ideal := h.opts.Ideal(cfg)
	rctx, cancel := context.WithTimeout(ctx, 10*ideal+3*time.Minute)
	defer cancel()
	if cfg.Outage > 0 {
		h.bw.SetNodeCap(int64(float64(h.opts.SetBytes()) / slowPull.Seconds()))
		defer h.bw.SetNodeCap(h.opts.NodeCap)
	}
	procs, err := h.startProcs(rctx, cfg, logDir)
	defer func() {
		for _, p := range procs {
			if p.cmd.Process != nil {
				_ = p.cmd.Process.Kill()
			}
			<-p.done
		}
	}()
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		select {
		case <-p.ready:
		case <-rctx.Done():
			return nil, fmt.Errorf("agents not ready: %w", rctx.Err())
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("agents process exited before the start: %v (see %s)", p.err, logDir)
		default:
		}
	}
	h.labeledN = cfg.allNodes()
	lw := &leaseWatch{holders: map[string]string{}}
	wctx, stopWatch := context.WithCancel(rctx)
	defer stopWatch()
	if err := lw.run(wctx, h.cs); err != nil {
		return nil, fmt.Errorf("watch slot leases: %w", err)
	}
	rc := h.cs.Discovery().RESTClient()
	first, err := h.scrapeAPI(rctx, rc)
	if err != nil {
		return nil, err
	}
	every := h.opts.ScrapeEvery
	if every <= 0 {
		every = min(max(ideal/25, time.Second), 5*time.Second)
	}
	var scrapes []scrape
	scrapes = append(scrapes, first)
	sctx, stopScrape := context.WithCancel(rctx)
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if s, err := h.scrapeAPI(sctx, rc); err == nil {
					scrapes = append(scrapes, s)
				}
			}
		}
	}()
	h.progress("%s: %d agents in %d processes ready; go (ideal %.1fs)", cfg.Name(), cfg.Nodes, len(procs), ideal.Seconds())
	t0 := time.Now()
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			stopScrape()
			return nil, fmt.Errorf("start agents: %w", err)
		}
	}
	fctx, stopFaults := context.WithCancel(rctx)
	faulted := make(chan error, 1)
	var ft faultTimes
	go func() {
		var err error
		ft, err = h.faults(fctx, cfg, procs, t0)
		faulted <- err
	}()
	var procErr error
	for _, p := range procs {
		<-p.done
		if p.err != nil {
			procErr = errors.Join(procErr, fmt.Errorf("agents process: %w (see %s)", p.err, logDir))
		}
	}
	end := time.Now()
	stopFaults()
	procErr = errors.Join(procErr, <-faulted)
	stopScrape()
	<-scraped
	last, err := scrapeRequests(ctx, rc)
	if err != nil {
		return nil, err
	}
	scrapes = append(scrapes, last)
	stopWatch()
	if procErr != nil {
		return nil, procErr
	}

	var events []event
	usage := ProcUsage{}
	for _, p := range procs {
		events = append(events, p.events...)
		if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			usage.CPU += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			usage.MaxRSS = append(usage.MaxRSS, ru.Maxrss*1024)
		}
	}
	run := analyze(cfg, h.opts, t0, end, events, scrapes, ft)
	run.Usage = usage
	run.PeakHeldAPI = lw.Peak()
	run.WatchRestarts = lw.Restarts()
	run.PropagationP50, run.PropagationP99 = lw.Propagation(t0.Add(run.WindowStart), t0.Add(run.WindowEnd))
	if errs := lw.Errors(); len(errs) > 0 {
		return nil, fmt.Errorf("the watch on the slot Leases failed, so the peak it saw is not the run's: %s", strings.Join(errs, "; "))
	}
	st := h.bw.Stats()
	run.Served, run.Needed = st.Served, int64(cfg.Nodes)*h.opts.SetBytes()
	run.Cancelled, run.PeakPulling = st.Cancelled, st.PeakNodes
	if err := h.checkLabels(ctx, cfg, run); err != nil {
		return nil, err
	}
	h.progress("%s: last label at %.1fs (%.2f× ideal), %d/%d succeeded, peak held %d (agents) %d (API), waiter requests %.2f per waiting node per minute, hand-over p50 %s p99 %s",
		cfg.Name(), run.Last.Seconds(), run.Ratio(), run.Succeeded, cfg.Nodes, run.PeakHeldAgents, run.PeakHeldAPI,
		run.PerWaiterMinute(), run.HandOverP50.Round(time.Millisecond), run.HandOverP99.Round(time.Millisecond))
	if cfg.Join {
		if run.Joiners, err = h.joiners(ctx, cfg, logDir); err != nil {
			return nil, err
		}
	}
	return run, nil
}

// faultTimes are when a run's fault began and ended, from the start.
type faultTimes struct{ Start, End time.Duration }

// faults makes cfg's fault happen, faultAt after t0, unless ctx ends
// first (the run ended). An apiserver it stopped it always starts again.
func (h *harness) faults(ctx context.Context, cfg Config, procs []*agentsProc, t0 time.Time) (faultTimes, error) {
	var ft faultTimes
	if cfg.Outage == 0 && cfg.Throttle == 0 && cfg.Shrink == 0 || !sleepUntil(ctx, t0.Add(faultAt)) {
		return ft, nil
	}
	send := func(line func(p int) string) error {
		for i, p := range procs {
			if _, err := io.WriteString(p.stdin, line(i)+"\n"); err != nil {
				return fmt.Errorf("send %q: %w", line(i), err)
			}
		}
		return nil
	}
	ft.Start = time.Since(t0)
	switch {
	case cfg.Outage > 0:
		h.progress("%s: stopping the apiserver for %s", cfg.Name(), cfg.Outage)
		if err := h.c.StopAPIServer(ctx); err != nil {
			return ft, err
		}
		sleepUntil(ctx, t0.Add(faultAt+cfg.Outage))
		err := h.c.StartAPIServer(context.WithoutCancel(ctx))
		ft.End = time.Since(t0)
		h.progress("%s: the apiserver is back", cfg.Name())
		if err != nil || !sleepUntil(ctx, t0.Add(faultAt+cfg.Outage+cutAfter)) {
			return ft, err
		}
		h.progress("%s: stopping the agents", cfg.Name())
		return ft, send(func(int) string { return "stop" })
	case cfg.Throttle > 0:
		h.progress("%s: takes answered 429 for %s", cfg.Name(), cfg.Throttle)
		if err := send(func(int) string { return "throttle on" }); err != nil {
			return ft, err
		}
		sleepUntil(ctx, t0.Add(faultAt+cfg.Throttle))
		ft.End = time.Since(t0)
		return ft, send(func(int) string { return "throttle off" })
	default:
		h.progress("%s: every waiting node but %d leaves", cfg.Name(), cfg.Shrink)
		ft.End = ft.Start
		return ft, send(func(p int) string {
			keep := cfg.Shrink / len(procs)
			if p < cfg.Shrink%len(procs) {
				keep++
			}
			return fmt.Sprintf("shrink %d", keep)
		})
	}
}

// sleepUntil waits until t or until ctx ends; it reports whether t came.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// checkLabels reads every node's label back from the API.
func (h *harness) checkLabels(ctx context.Context, cfg Config, run *Run) error {
	list, err := h.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for i := range cfg.Nodes {
		want[h.ids[i].Node] = true
	}
	key := v1alpha1.NodeKey(instance)
	for _, n := range list.Items {
		if !want[n.Name] {
			continue
		}
		switch n.Labels[key] {
		case v1alpha1.LabelSucceeded:
			run.Succeeded++
		case v1alpha1.LabelFailed:
			run.Failed++
		}
	}
	return nil
}

// copyDir copies the regular files under src into dst.
func copyDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}

// DefaultConfigs are the runs, at 1,000 nodes: K=50, K=100 and one seed
// with K=50, then with K=50 a 30 s apiserver outage, 5 % of the takes'
// answers lost, and a herd that shrinks to 10 waiting nodes.
func DefaultConfigs() []Config {
	return []Config{
		{Nodes: 1000, Slots: 50}, {Nodes: 1000, Slots: 100}, {Nodes: 1000, Slots: 50, SeedNodes: 1},
		{Nodes: 1000, Slots: 50, Outage: 30 * time.Second},
		{Nodes: 1000, Slots: 50, LostAnswers: 5},
		{Nodes: 1000, Slots: 50, Shrink: 10},
	}
}

// ParseConfig reads a Name: n<nodes>-k<K>[-seed<N>][-outage<d>][-throttle<d>][-lost<percent>][-shrink<N>][-join].
func ParseConfig(s string) (Config, error) {
	var c Config
	bad := fmt.Errorf("bad configuration %q: want n<nodes>-k<K>[-seed<N>][-outage<duration>][-throttle<duration>][-lost<percent>][-shrink<N>][-join], e.g. n1000-k10-outage30s", s)
	for i, part := range strings.Split(s, "-") {
		var err error
		switch {
		case i == 0:
			_, err = fmt.Sscanf(part, "n%d", &c.Nodes)
		case i == 1:
			_, err = fmt.Sscanf(part, "k%d", &c.Slots)
		case strings.HasPrefix(part, "seed"):
			_, err = fmt.Sscanf(part, "seed%d", &c.SeedNodes)
		case strings.HasPrefix(part, "outage"):
			c.Outage, err = time.ParseDuration(strings.TrimPrefix(part, "outage"))
		case strings.HasPrefix(part, "throttle"):
			c.Throttle, err = time.ParseDuration(strings.TrimPrefix(part, "throttle"))
		case strings.HasPrefix(part, "lost"):
			_, err = fmt.Sscanf(part, "lost%d", &c.LostAnswers)
		case strings.HasPrefix(part, "shrink"):
			_, err = fmt.Sscanf(part, "shrink%d", &c.Shrink)
		case part == "join":
			c.Join = true
		default:
			err = bad
		}
		if err != nil {
			return Config{}, bad
		}
	}
	if c.Nodes < 1 || c.Slots < 1 || c.Name() != s {
		return Config{}, bad
	}
	return c, nil
}
