// Package bench measures how the agent's herd control shapes the load on a
// registry. It brings up a real kube-apiserver, many runtime-only nodes
// (each a containerd of its own), one in-process registry with a bandwidth
// cap, and runs the real agent binary on every node, once per herd-control
// configuration, then once more with every image present. It reports
// numbers; it asserts nothing about time.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Options say what to measure.
type Options struct {
	// Nodes is the number of simulated nodes (containerd + agent).
	Nodes int
	// ImageSizes are the images' total sizes in bytes; each is split into
	// a few layers.
	ImageSizes []int64
	// Bandwidth caps all registry responses together, bytes per second.
	Bandwidth int64
	// Latency is added to every registry response.
	Latency time.Duration
	// Parallelism is the agent's --parallelism.
	Parallelism int
	// MaxConcurrentDownloads is containerd's per-image blob concurrency.
	MaxConcurrentDownloads int
	// Configs are measured in order.
	Configs []Config
	// Agent is the image-prefetcher binary.
	Agent string
	// Seed makes the image contents (and so their digests) reproducible.
	Seed int64
	// RunTimeout bounds one run of the agents.
	RunTimeout time.Duration
	// LogDir, if set, keeps the agents' and components' logs there.
	LogDir string
	// Progress receives progress lines. Default os.Stderr.
	Progress io.Writer
}

// DefaultConfigs are the configurations of issue 6.
var DefaultConfigs = []Config{
	{Name: "nocap"},
	{Name: "k2", MaxConcurrentNodes: 2},
	{Name: "k5", MaxConcurrentNodes: 5},
	{Name: "seed1", MaxConcurrentNodes: 5, SeedNodes: 1},
}

const (
	namespace = "image-prefetcher-bench"
	// instancePrefix names each configuration's instance, so that slot
	// Leases and seed records never carry over between configurations.
	instancePrefix = "bench-"
)

type bench struct {
	opts   Options
	c      *cluster.Cluster
	nodes  []*cluster.Node
	images []Image
	list   string // the image list file
	kubecf string // the agent's kubeconfig
	dir    string
	start  time.Time
	cap    Capacity
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.opts.Progress, ">> bench [%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// Measure brings the simulated cluster up, measures every configuration,
// tears everything down and returns the report. Teardown leftovers are an
// error.
func Measure(ctx context.Context, opts Options) (rep *Report, err error) {
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	b := &bench{opts: opts, start: time.Now()}
	b.cap.MemAvailable = memAvailable()
	// Zeros when statfs fails: the report then says nothing of the disk.
	capacity, available, _ := disk.Statfs(os.TempDir())
	b.cap.DiskFree = int64(available)
	if err := diskRoom(disk.Usage{CapacityBytes: capacity, AvailableBytes: available}, opts.diskNeed()); err != nil {
		return nil, err
	}

	c, err := cluster.Start(ctx, cluster.Options{Nodes: 0, Progress: opts.Progress})
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	b.c = c
	defer func() {
		if opts.LogDir != "" {
			if kerr := copyFiles(filepath.Join(c.Dir, "logs"), opts.LogDir); kerr != nil {
				b.progress("keeping logs: %v", kerr)
			}
		}
		serr := c.Stop(context.WithoutCancel(ctx))
		if left := c.Leftovers(); len(left) > 0 {
			serr = errors.Join(serr, fmt.Errorf("teardown left behind: %s", strings.Join(left, "; ")))
		}
		if serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	b.dir = filepath.Join(c.Dir, "bench")
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create bench directory: %w", err)
	}
	return b.measure(ctx)
}

// diskNeed is what the nodes' containerd roots will hold: each keeps an
// image twice, as the blobs of its content store and as an unpacked
// snapshot (a node's root held 455 MiB for the default 227 MiB set).
func (o *Options) diskNeed() uint64 {
	var set int64
	for _, s := range o.ImageSizes {
		set += s
	}
	return 2 * uint64(set) * uint64(o.Nodes)
}

func (o *Options) validate() error {
	switch {
	case o.Nodes < 1:
		return errors.New("need at least one node")
	case len(o.ImageSizes) == 0:
		return errors.New("need at least one image")
	case o.Parallelism < 1:
		return errors.New("parallelism must be at least 1")
	case o.Agent == "":
		return errors.New("no agent binary (build it with `make build`)")
	}
	if _, err := os.Stat(o.Agent); err != nil {
		return fmt.Errorf("agent binary: %w (build it with `make build`)", err)
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = 10 * time.Minute
	}
	if len(o.Configs) == 0 {
		o.Configs = DefaultConfigs
	}
	return nil
}

func (b *bench) measure(ctx context.Context) (*Report, error) {
	nodes, err := b.c.StartRuntimes(ctx, b.opts.Nodes, cluster.RuntimeOptions{MaxConcurrentDownloads: b.opts.MaxConcurrentDownloads})
	if err != nil {
		return nil, err
	}
	b.nodes = nodes
	reg := b.c.Registry()
	reg.SetLatency(b.opts.Latency)
	if err := b.pushImages(ctx); err != nil {
		return nil, err
	}
	if err := b.setupAPI(ctx); err != nil {
		return nil, err
	}

	rep := &Report{
		Date:                   time.Now().UTC(),
		Machine:                machine(),
		Versions:               "Kubernetes " + cluster.KubeVersion + ", " + containerdVersion(ctx),
		Nodes:                  len(b.nodes),
		Images:                 b.images,
		Bandwidth:              b.opts.Bandwidth,
		Latency:                b.opts.Latency,
		Parallelism:            b.opts.Parallelism,
		MaxConcurrentDownloads: b.opts.MaxConcurrentDownloads,
	}
	if rep.MaxConcurrentDownloads == 0 {
		rep.MaxConcurrentDownloads = 3 // containerd's default
	}

	// How fast one node pulls on its own decides how many nodes it takes
	// to fill the cap.
	b.progress("calibration: one node, no bandwidth cap")
	reg.SetBandwidth(0)
	calib, err := b.runOnce(ctx, Config{Name: calibrationName}, b.nodes[:1], false)
	if err != nil {
		return nil, fmt.Errorf("calibration: %w", err)
	}
	if calib.Last() > 0 {
		rep.SingleNode = float64(calib.Bytes) / calib.Last().Seconds()
	}
	rep.UsefulConcurrency = 1
	if rep.SingleNode > 0 && b.opts.Bandwidth > 0 {
		rep.UsefulConcurrency = max(1, int(math.Ceil(float64(b.opts.Bandwidth)/rep.SingleNode)))
	}
	b.progress("one node alone: %s; useful concurrency %d node(s)", rate(rep.SingleNode), rep.UsefulConcurrency)
	reg.SetBandwidth(b.opts.Bandwidth)

	for _, cfg := range b.opts.Configs {
		for _, second := range []bool{false, true} {
			run, err := b.runOnce(ctx, cfg, b.nodes, second)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cfg.Describe(), err)
			}
			rep.Runs = append(rep.Runs, run)
			if !second {
				b.measureNodes()
			}
		}
	}
	rep.Capacity = b.cap
	rep.Elapsed = time.Since(b.start)
	return rep, nil
}

// runOnce runs the agents of cfg on nodes. A first run starts from empty
// nodes; a second keeps what the previous run pulled.
func (b *bench) runOnce(ctx context.Context, cfg Config, nodes []*cluster.Node, second bool) (Run, error) {
	run := Run{Config: cfg, Second: second}
	which := "first run"
	if second {
		which = "second run"
	}
	// Restarting every containerd closes the connections a previous run
	// left idle, so that the registry's peaks count this run's only.
	if err := b.c.RestartRuntimes(ctx, nodes, !second); err != nil {
		return run, err
	}
	instance := instancePrefix + cfg.Name
	if err := b.clearLabels(ctx, nodes, instance); err != nil {
		return run, err
	}
	reg := b.c.Registry()
	if err := waitIdle(ctx, reg); err != nil {
		return run, err
	}
	reg.ResetStats()
	b.progress("%s, %s: starting %d agents", cfg.Describe(), which, len(nodes))

	if b.opts.LogDir != "" {
		defer func() {
			if err := copyFiles(b.dir, filepath.Join(b.opts.LogDir, "agents")); err != nil {
				b.progress("keeping agent logs: %v", err)
			}
		}()
	}
	rctx, cancel := context.WithTimeout(ctx, b.opts.RunTimeout)
	defer cancel()
	cpu0 := readCPU()
	t0 := time.Now()
	agents := make([]*agentProc, len(nodes))
	for i, n := range nodes {
		a, err := b.startAgent(rctx, cfg, n, instance, second)
		if err != nil {
			for _, a := range agents[:i] {
				a.kill()
			}
			return run, err
		}
		agents[i] = a
	}
	done := make(chan struct{})
	go func() {
		for _, a := range agents {
			<-a.done
		}
		close(done)
	}()

	watch := &watcher{b: b, instance: instance, nodes: nodes, t0: t0, seen: map[string]labelSeen{}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	exited := false
	for !exited {
		select {
		case <-done:
			exited = true
		case <-tick.C:
		case <-rctx.Done():
			for _, a := range agents {
				a.kill()
			}
			<-done
			return run, fmt.Errorf("agents did not finish within %s (logs in %s)", b.opts.RunTimeout, b.dir)
		}
		watch.sample(rctx)
		for _, a := range agents {
			a.sampleRSS()
		}
	}
	// Labels written just before an agent exited.
	watch.sample(ctx)
	run.CPUBusy = cpuBusy(cpu0, readCPU())

	st := reg.Stats()
	run.PeakConns, run.PeakBlobTransfers = st.PeakConns, st.PeakBlobTransfers
	run.Requests, run.Bytes = st.Requests, st.BytesSent
	run.PeakSlotHolders = watch.peakHolders
	var failures []string
	for _, n := range nodes {
		s, ok := watch.seen[n.Name]
		switch {
		case !ok:
			run.Failed++
			failures = append(failures, n.Name+" not labeled")
		case s.value != v1alpha1.LabelSucceeded:
			run.Failed++
			failures = append(failures, n.Name+" labeled "+s.value)
			run.Completions = append(run.Completions, s.at)
		default:
			run.Completions = append(run.Completions, s.at)
		}
	}
	slices.Sort(run.Completions)
	for i, a := range agents {
		if a.err != nil {
			failures = append(failures, fmt.Sprintf("%s agent: %v", nodes[i].Name, a.err))
		}
		b.cap.AgentPeakRSS = max(b.cap.AgentPeakRSS, a.maxRSS.Load())
	}
	b.progress("%s, %s: all labeled after %.1fs; registry: %d requests, %s, peak %d conns, %d blob transfers; peak slot holders %d",
		cfg.Describe(), which, run.Last().Seconds(), run.Requests, size(run.Bytes), run.PeakConns, run.PeakBlobTransfers, run.PeakSlotHolders)
	if len(failures) > 0 {
		b.progress("problems (agent logs in %s): %s", b.dir, strings.Join(failures, "; "))
	}
	return run, nil
}

// waitIdle waits until the registry has no open connection, so that a
// run's peak counts that run's connections only.
func waitIdle(ctx context.Context, reg *registry.Registry) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for reg.Stats().Conns > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("registry still has %d open connections: %w", reg.Stats().Conns, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// measureNodes records, after a full pull, what one node costs.
func (b *bench) measureNodes() {
	for _, n := range b.nodes {
		if pid := n.ContainerdPID(); pid > 0 {
			b.cap.ContainerdPeakRSS = max(b.cap.ContainerdPeakRSS, peakRSS(pid))
		}
		b.cap.DiskPerNode = max(b.cap.DiskPerNode, duBytes(n.ContainerdRoot()))
	}
}

type agentProc struct {
	pid  int
	done chan struct{}
	err  error
	// maxRSS is sampled from /proc while the agent runs: the rusage of
	// a child forked from this big process would count the parent's
	// pages it shared until exec.
	maxRSS atomic.Int64
	kill   func()
}

func (a *agentProc) sampleRSS() {
	select {
	case <-a.done:
		return
	default:
	}
	if v := peakRSS(a.pid); v > a.maxRSS.Load() {
		a.maxRSS.Store(v)
	}
}

func (b *bench) startAgent(ctx context.Context, cfg Config, n *cluster.Node, instance string, second bool) (*agentProc, error) {
	args := []string{
		"fetch",
		"--kubeconfig=" + b.kubecf,
		"--cri-socket=" + n.CRISocket,
		"--node-name=" + n.Name,
		"--instance=" + instance,
		"--image-list-file=" + b.list,
		fmt.Sprintf("--parallelism=%d", b.opts.Parallelism),
		// Metrics on, as a monitored cluster runs the agent: the herd
		// control gate then goes through the metrics wrapper.
		"--metrics-addr=127.0.0.1:0",
	}
	if cfg.MaxConcurrentNodes > 0 {
		args = append(args, fmt.Sprintf("--max-concurrent-nodes=%d", cfg.MaxConcurrentNodes))
	}
	if cfg.SeedNodes > 0 {
		args = append(args, fmt.Sprintf("--seed-nodes=%d", cfg.SeedNodes))
	}
	run := "1"
	if second {
		run = "2"
	}
	logPath := filepath.Join(b.dir, fmt.Sprintf("%s-run%s-%s.log", cfg.Name, run, n.Name))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("agent log: %w", err)
	}
	cmd := b.c.Command(ctx, b.opts.Agent, args...)
	cmd.Env = append(cmd.Env, "POD_NAME=image-prefetcher-"+n.Name, "POD_NAMESPACE="+namespace)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start agent on %s: %w", n.Name, err)
	}
	a := &agentProc{pid: cmd.Process.Pid, done: make(chan struct{}), kill: func() { _ = cmd.Process.Kill() }}
	go func() {
		defer close(a.done)
		defer f.Close()
		if err := cmd.Wait(); err != nil {
			a.err = fmt.Errorf("%w (log %s)", err, logPath)
		}
	}()
	return a, nil
}

func machine() string {
	return fmt.Sprintf("%d CPU cores, %s of memory, %s/%s", runtime.NumCPU(), size(memTotal()), runtime.GOOS, runtime.GOARCH)
}
