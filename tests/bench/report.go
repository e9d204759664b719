package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MiB is the unit of every size the benchmark prints.
const MiB = 1 << 20

// Config is one herd-control setting of the agents.
type Config struct {
	// Name is the short label used in the table, the plot and the
	// instance name.
	Name string
	// MaxConcurrentNodes is --max-concurrent-nodes (K); 0 means no cap.
	MaxConcurrentNodes int
	// SeedNodes is --seed-nodes.
	SeedNodes int
}

// calibrationName names the run that measures one node alone.
const calibrationName = "calibration"

// Describe says what the configuration does, for the table.
func (c Config) Describe() string {
	switch {
	case c.Name == calibrationName:
		return "calibration (one node, registry uncapped)"
	case c.MaxConcurrentNodes == 0:
		return "no cap"
	case c.SeedNodes > 0:
		return fmt.Sprintf("seed=%d, K=%d", c.SeedNodes, c.MaxConcurrentNodes)
	default:
		return fmt.Sprintf("K=%d", c.MaxConcurrentNodes)
	}
}

// Image is one image of the benchmark's set.
type Image struct {
	Ref    string
	Layers int
	// Bytes is what one pull of the image transfers: manifest, config and
	// layers.
	Bytes int64
}

// Capacity is what was measured about how many nodes fit on the machine.
type Capacity struct {
	// ContainerdPeakRSS is the largest peak RSS of a node's containerd
	// after a full pull.
	ContainerdPeakRSS int64
	// AgentPeakRSS is the largest peak RSS of one agent process.
	AgentPeakRSS int64
	// DiskPerNode is the largest containerd root after a full pull.
	DiskPerNode int64
	// MemAvailable and DiskFree are what the machine had before the start.
	MemAvailable int64
	DiskFree     int64
}

// FitByMemory is how many nodes (containerd and agent) the available
// memory holds at the measured peaks.
func (c Capacity) FitByMemory() int {
	per := c.ContainerdPeakRSS + c.AgentPeakRSS
	if per <= 0 {
		return 0
	}
	return int(c.MemAvailable / per)
}

// FitByDisk is how many nodes with the full image set the free disk holds.
func (c Capacity) FitByDisk() int {
	if c.DiskPerNode <= 0 {
		return 0
	}
	return int(c.DiskFree / c.DiskPerNode)
}

// Run is the outcome of one run of the agents on every node.
type Run struct {
	Config Config
	// Second is the run with every image already present.
	Second bool
	// Completions holds, per node, the time from the start of the agents
	// until its label appeared, in ascending order. Nodes never labeled
	// are missing from it.
	Completions []time.Duration
	// Failed counts nodes labeled "failed" or not labeled at all.
	Failed int
	// PeakConns and PeakBlobTransfers are the registry's peaks.
	PeakConns, PeakBlobTransfers int64
	// Requests and Bytes are what the registry served.
	Requests, Bytes int64
	// PeakSlotHolders is the most slot Leases seen held at once (sampled).
	PeakSlotHolders int
	// CPUBusy is the machine's average CPU use during the run, 0..1.
	CPUBusy float64
}

// Last is the time until every node was labeled (the last completion).
func (r Run) Last() time.Duration {
	if len(r.Completions) == 0 {
		return 0
	}
	return slices.Max(r.Completions)
}

// Ideal is the bandwidth-limited lower bound of a run: the bytes it served
// divided by the registry's cap. Zero without a cap.
func Ideal(bytes, bytesPerSecond int64) time.Duration {
	if bytesPerSecond <= 0 {
		return 0
	}
	return time.Duration(float64(bytes) / float64(bytesPerSecond) * float64(time.Second))
}

// Ratio is actual / ideal, or NaN when there is no ideal.
func Ratio(actual, ideal time.Duration) float64 {
	if ideal <= 0 {
		return math.NaN()
	}
	return float64(actual) / float64(ideal)
}

// Report is everything the benchmark measured.
type Report struct {
	Date     time.Time
	Machine  string
	Versions string
	Nodes    int
	Images   []Image
	// Bandwidth is the registry's cap in bytes per second.
	Bandwidth int64
	Latency   time.Duration
	// Parallelism is the agent's --parallelism; MaxConcurrentDownloads is
	// containerd's per-image blob concurrency. Together they bound how
	// many blobs one node fetches at once.
	Parallelism            int
	MaxConcurrentDownloads int
	// SingleNode is one node's throughput, in bytes per second, pulling
	// the set with no bandwidth cap; UsefulConcurrency is how many nodes
	// it takes to fill the cap at that rate.
	SingleNode        float64
	UsefulConcurrency int
	Capacity          Capacity
	Runs              []Run
	Elapsed           time.Duration
	// Load is the machine's load average (1, 5, 15 min) at the start.
	Load string
	// Plot is the plot's file name, relative to the report.
	PlotFile string
	// Before, when set, is a report of the same runs on other code, shown
	// side by side (not saved with this one); BeforeLabel and AfterLabel
	// name the two.
	Before                  *Report `json:"-"`
	BeforeLabel, AfterLabel string  `json:"-"`
}

// NeededBytes is what a run must transfer at least: the whole set to
// every node on empty nodes, nothing when everything is present.
func (r Report) NeededBytes(run Run) int64 {
	if run.Second {
		return 0
	}
	return int64(r.Nodes) * r.SetBytes()
}

// RunIdeal is the ideal of a run: its needed bytes over the cap. Bytes
// that a run fetched twice (an attempt cancelled on its timeout and
// retried) count against it, not into the ideal.
func (r Report) RunIdeal(run Run) time.Duration {
	return Ideal(r.NeededBytes(run), r.Bandwidth)
}

// SetBytes is what one node pulls: the whole image set.
func (r Report) SetBytes() int64 {
	var n int64
	for _, img := range r.Images {
		n += img.Bytes
	}
	return n
}

// PerNodeParallelism is the most blobs one node fetches at once.
func (r Report) PerNodeParallelism() int {
	return r.Parallelism * max(1, r.MaxConcurrentDownloads)
}

// BlobBound is the most concurrent blob transfers a configuration allows:
// K × per-node parallelism, or every node's when uncapped.
func (r Report) BlobBound(c Config) int {
	k := c.MaxConcurrentNodes
	if k <= 0 || k > r.Nodes {
		k = r.Nodes
	}
	return k * r.PerNodeParallelism()
}

// Check is one target and whether a run met it.
type Check struct {
	Run    string
	Target string
	Value  string
	OK     bool
}

// Checks evaluates the targets on every run they apply to:
// blob transfers within K × per-node parallelism under a cap K; the
// registry serving at most 1.02× the bytes the nodes need, with a cap or
// without; the last node within 1.3× of the ideal when K is at least the
// useful concurrency, and within 1.2× without a cap; no registry requests
// on a second run.
func (r Report) Checks() []Check {
	var out []Check
	for _, run := range r.Runs {
		out = append(out, r.runChecks(run)...)
		if run.Failed > 0 {
			out = append(out, Check{runName(run), "every node labeled succeeded", fmt.Sprintf("%d not", run.Failed), false})
		}
	}
	return out
}

func (r Report) runChecks(run Run) []Check {
	name := runName(run)
	if run.Second {
		return []Check{{name, "0 registry requests", fmt.Sprintf("%d requests", run.Requests), run.Requests == 0}}
	}
	var out []Check
	k := run.Config.MaxConcurrentNodes
	if k > 0 {
		b := r.BlobBound(run.Config)
		out = append(out, Check{name, fmt.Sprintf("peak blob transfers ≤ K × %d = %d", r.PerNodeParallelism(), b),
			fmt.Sprintf("%d", run.PeakBlobTransfers), run.PeakBlobTransfers <= int64(b)})
	}
	if need := r.NeededBytes(run); need > 0 {
		served := float64(run.Bytes) / float64(need)
		out = append(out, Check{name, "served ≤ 1.02 × needed", fmt.Sprintf("%.2f ×", served), served <= MaxServedRatio})
	}
	if r.Bandwidth > 0 && k > 0 && k >= r.UsefulConcurrency {
		ratio := Ratio(run.Last(), r.RunIdeal(run))
		out = append(out, Check{name, "last node ≤ 1.3 × ideal", fmt.Sprintf("%.2f ×", ratio), ratio <= 1.3})
	}
	if r.Bandwidth > 0 && k == 0 {
		ratio := Ratio(run.Last(), r.RunIdeal(run))
		out = append(out, Check{name, "last node ≤ 1.2 × ideal", fmt.Sprintf("%.2f ×", ratio), ratio <= 1.2})
	}
	return out
}

// MaxServedRatio is the most the registry may serve over what the nodes
// need (issue 18): pull attempts that are cut off and start over would
// show above it.
const MaxServedRatio = 1.02

func runName(run Run) string {
	if run.Second {
		return run.Config.Describe() + ", 2nd run"
	}
	return run.Config.Describe()
}

// Markdown renders the report as docs/benchmarks.md.
func (r Report) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks\n\n")
	w("<!-- Written by `make bench` (tests/bench); edits are overwritten. -->\n\n")
	w("How fast a simulated cluster prefetches an image set, and how hard it hits the registry, with and without the agent's herd control (`pull.maxConcurrentNodes`, `pull.seedNodes`). Run it with `make bench` (root, about %s here).\n\n", roundDuration(r.Elapsed, time.Minute))
	w("## Set-up\n\n")
	w("- **Cluster:** a real etcd and kube-apiserver (%s) in a private network namespace; %d nodes, each a Node object, a containerd of its own (own root, state directory and socket) and the real agent binary (`image-prefetcher fetch`) run as a process with a kubeconfig whose service account has exactly the agent's RBAC.\n", r.Versions, r.Nodes)
	w("- **Machine:** %s.\n", r.Machine)
	w("- **Registry:** one in-process OCI registry, capped at %s for all responses together, %s of latency added to every response.\n", rate(float64(r.Bandwidth)), r.Latency)
	w("- **Images:** %d images, %s in all, %d layers of incompressible random bytes (generated from a fixed seed at start), referenced by digest:\n\n", len(r.Images), size(r.SetBytes()), r.layers())
	w("  | image | layers | size |\n  |---|---:|---:|\n")
	for _, img := range r.Images {
		w("  | `%s` | %d | %s |\n", shortRef(img.Ref), img.Layers, size(img.Bytes))
	}
	w("\n- **Agents:** `--parallelism=%d` images at once per node, metrics on (`--metrics-addr`); containerd's `max_concurrent_downloads = %d` blob(s) per image, so one node fetches at most %d blobs at once (the per-node parallelism below). Every other flag keeps its default: a pull attempt is cut after 30 s (doubling up to 5 min) without a byte arriving at the node's containerd, never while bytes arrive (docs/agent.md, \"Attempt timeouts and progress\").\n", r.Parallelism, r.MaxConcurrentDownloads, r.PerNodeParallelism())
	w("- **Ideal:** the bytes every node needs ÷ the bandwidth cap, the time no schedule can beat. One node alone, uncapped, pulls at %s, so %d node(s) at a time fill the cap: that is the registry's useful concurrency.\n\n", rate(r.SingleNode), r.UsefulConcurrency)

	w("## Results\n\n")
	w("Time is from the start of all agents until the node's label appears. *Peak conns* and *peak blobs* are the registry's most concurrent connections and blob downloads (connections include the idle keep-alive ones containerd leaves open after each pull); *slots* is the most slot Leases seen held at once (sampled every 100 ms).\n\n")
	w("| configuration | run | all labeled | ideal | ratio | first labeled | peak conns | peak blobs | bound | slots | requests | served | CPU |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		which := "1st (empty nodes)"
		if run.Second {
			which = "2nd (all present)"
		}
		ideal := r.RunIdeal(run)
		ratio := "–"
		if ideal > 0 {
			ratio = fmt.Sprintf("%.2f", Ratio(run.Last(), ideal))
		}
		first := time.Duration(0)
		if len(run.Completions) > 0 {
			first = run.Completions[0]
		}
		served := size(run.Bytes)
		if need := r.NeededBytes(run); need > 0 {
			served += fmt.Sprintf(" (%.2f×)", float64(run.Bytes)/float64(need))
		}
		w("| %s | %s | %s | %s | %s | %s | %d | %d | %d | %d | %d | %s | %.0f%% |\n",
			run.Config.Describe(), which, secs(run.Last()), secs(ideal), ratio, secs(first),
			run.PeakConns, run.PeakBlobTransfers, r.BlobBound(run.Config), run.PeakSlotHolders,
			run.Requests, served, run.CPUBusy*100)
	}
	w("\n*ideal* is the set's size × %d nodes ÷ the cap; *bound* is K × per-node parallelism (every node's when uncapped); *served* is what the registry sent, and in brackets its ratio to what the nodes needed: above 1 when pull attempts were cut off and started again (no runtime resumes a cut pull; the agent cuts an attempt only when its runtime receives no bytes for the attempt timeout, docs/agent.md).\n\n", r.Nodes)
	if r.PlotFile != "" {
		w("![Nodes labeled over time, per configuration](%s)\n\n", r.PlotFile)
	}

	w("## Targets\n\n")
	checks := r.Checks()
	w("| run | target | measured | met |\n|---|---|---:|:---:|\n")
	for _, c := range checks {
		met := "yes"
		if !c.OK {
			met = "**no**"
		}
		w("| %s | %s | %s | %s |\n", c.Run, c.Target, c.Value, met)
	}
	w("\n")
	if r.Before != nil {
		r.beforeAfter(w)
	}

	c := r.Capacity
	w("## How many nodes fit\n\n")
	w("Measured during the run: a node's containerd peaks at %s RSS after pulling the set, an agent at %s, and a node's containerd root holds %s. Before the start the machine had %s of memory available and %s of free disk, enough for about %d nodes by memory and %d by disk. ",
		size(c.ContainerdPeakRSS), size(c.AgentPeakRSS), size(c.DiskPerNode), size(c.MemAvailable), size(c.DiskFree), c.FitByMemory(), c.FitByDisk())
	if min(c.FitByMemory(), c.FitByDisk()) >= 2*r.Nodes {
		w("Memory and disk are far from the limit at %d nodes; the CPU is the tighter resource. ", r.Nodes)
	}
	w("The *CPU* column above shows how busy the machine's cores were during each run: the control plane, the registry, every containerd and every agent share them, with whatever else the machine runs.\n\n")

	w("## Method\n\n")
	w("- Before each configuration every containerd is stopped, its root deleted and started again, so every node starts empty. Before each run the registry's counters are reset, the node labels removed, and the containerds restarted so that no connection is carried over.\n")
	w("- Each configuration uses its own instance name, so its slot Leases and seed record start fresh.\n")
	w("- The second run starts the agents again on the same nodes; images pinned by digest are found with `ImageStatus` and never asked of the registry.\n")
	w("- The harness only reports numbers; nothing in it asserts on time.\n")
	return b.String()
}

// beforeAfter is the table of the runs both reports have, side by side.
func (r Report) beforeAfter(w func(string, ...any)) {
	w("## Before and after\n\nThe same runs, same harness, on %s (before; load average %s at its start) and on %s (after, above; load average %s), back to back. Each cell is before → after.\n\n", r.BeforeLabel, r.Before.Load, r.AfterLabel, r.Load)
	w("| configuration | run | all labeled | ratio | peak blobs (bound) | slots | served | CPU |\n|---|---|---|---|---|---|---|---|\n")
	for _, after := range r.Runs {
		for _, before := range r.Before.Runs {
			if before.Config != after.Config || before.Second != after.Second {
				continue
			}
			ratio := func(rep Report, run Run) string {
				if ideal := rep.RunIdeal(run); ideal > 0 {
					return fmt.Sprintf("%.2f", Ratio(run.Last(), ideal))
				}
				return "–"
			}
			w("| %s | %s | %s → %s | %s → %s | %d → %d (%d) | %d → %d | %s → %s | %.0f%% → %.0f%% |\n",
				after.Config.Describe(), map[bool]string{false: "1st", true: "2nd"}[after.Second],
				secs(before.Last()), secs(after.Last()), ratio(*r.Before, before), ratio(r, after),
				before.PeakBlobTransfers, after.PeakBlobTransfers, r.BlobBound(after.Config),
				before.PeakSlotHolders, after.PeakSlotHolders, size(before.Bytes), size(after.Bytes), before.CPUBusy*100, after.CPUBusy*100)
		}
	}
	w("\n")
}

func (r Report) layers() int {
	n := 0
	for _, img := range r.Images {
		n += img.Layers
	}
	return n
}

func shortRef(ref string) string {
	if i := strings.Index(ref, "@sha256:"); i > 0 && len(ref) > i+8+12 {
		return ref[:i+8+12] + "…"
	}
	return ref
}

func secs(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= MiB:
		return fmt.Sprintf("%.1f MiB", float64(n)/MiB)
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func rate(bytesPerSecond float64) string {
	if bytesPerSecond <= 0 {
		return "no cap"
	}
	return fmt.Sprintf("%.0f MiB/s", bytesPerSecond/MiB)
}

func roundDuration(d, unit time.Duration) string {
	if d <= 0 {
		return "a few minutes"
	}
	return fmt.Sprintf("%d min", max(1, int(math.Round(float64(d)/float64(unit)))))
}

// ParseConfigs reads a comma-separated list of configurations: "nocap",
// "k<K>", "seed<N>" (with K=5) or "seed<N>k<K>".
func ParseConfigs(s string) ([]Config, error) {
	var out []Config
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		c := Config{Name: name}
		var err error
		switch {
		case name == "nocap":
		case strings.HasPrefix(name, "seed"):
			rest := strings.TrimPrefix(name, "seed")
			seed, k, found := strings.Cut(rest, "k")
			if !found {
				k = "5"
			}
			if c.SeedNodes, err = strconv.Atoi(seed); err == nil {
				c.MaxConcurrentNodes, err = strconv.Atoi(k)
			}
		case strings.HasPrefix(name, "k"):
			c.MaxConcurrentNodes, err = strconv.Atoi(strings.TrimPrefix(name, "k"))
		default:
			err = errors.New("unknown")
		}
		if err != nil || c.MaxConcurrentNodes < 0 || c.SeedNodes < 0 || (c.Name != "nocap" && c.MaxConcurrentNodes == 0) {
			return nil, fmt.Errorf("bad configuration %q: want nocap, k<K>, seed<N> or seed<N>k<K>", name)
		}
		out = append(out, c)
	}
	return out, nil
}
