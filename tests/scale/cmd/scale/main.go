// Command scale runs the herd-control scale simulation (see tests/scale)
// and writes its report and plot. `make scale` runs it as root.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/bench"
	"github.com/image-prefetcher/image-prefetcher/tests/scale"
)

func main() {
	// The harness re-runs this binary for its agents processes.
	scale.MaybeRunAgents()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		opts     scale.Options
		configs  string
		images   int
		imageMiB float64
		capMiB   float64
		nodeMiB  float64
		out      string
		plotFile string
		jsonFile string
		before   string
	)
	var names []string
	for _, c := range scale.DefaultConfigs() {
		names = append(names, c.Name())
	}
	flag.StringVar(&configs, "configs", strings.Join(names, ","), "runs, in order: n<nodes>-k<K>[-seed<N>]")
	flag.IntVar(&images, "images", 4, "images in the list")
	flag.Float64Var(&imageMiB, "image-mib", 25, "size of each image in MiB")
	flag.Float64Var(&capMiB, "capacity", 1000, "registry capacity C in MiB/s, shared by all transfers")
	flag.Float64Var(&nodeMiB, "node-cap", 200, "each node's link b in MiB/s")
	flag.Float64Var(&opts.PullSeconds[0], "pull-min", 15, "shortest whole pull of a node, in seconds (each node's is drawn uniformly; 0 and -pull-max 0: links of -node-cap)")
	flag.Float64Var(&opts.PullSeconds[1], "pull-max", 60, "longest whole pull of a node, in seconds")
	flag.IntVar(&opts.Parallelism, "parallelism", 4, "agent --parallelism (images at once per node)")
	flag.IntVar(&opts.Procs, "procs", 4, "agents processes to spread the agents over")
	flag.StringVar(&opts.KeepLogs, "keep-logs", "", "copy the apiserver's and the agents' logs into this directory")
	flag.StringVar(&opts.CPUProfiles, "cpu-profiles", "", "write a CPU profile of every agents process into this directory (it must exist)")
	flag.StringVar(&out, "out", "docs/scale.md", "report to write")
	flag.StringVar(&plotFile, "plot", "docs/scale-completion.png", "plot to write (PNG)")
	flag.StringVar(&jsonFile, "json", "", "also write the report's numbers as JSON to this file (for -before of a later run)")
	flag.StringVar(&before, "before", "", "-json files of earlier runs on other code (comma-separated, joined in order), shown side by side with this one")
	var from string
	flag.StringVar(&from, "from", "", "instead of measuring, report the runs of these -json files (comma-separated, joined in order): runs made one at a time, each on a fresh control plane")
	var beforeLabel, afterLabel string
	flag.StringVar(&beforeLabel, "before-label", "the code before", "what the -before run measured, for the report")
	flag.StringVar(&afterLabel, "after-label", "this code", "what this run measures, for the report")
	flag.Parse()

	var err error
	for _, s := range strings.Split(configs, ",") {
		c, err := scale.ParseConfig(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		opts.Configs = append(opts.Configs, c)
	}
	for i := range images {
		opts.Images = append(opts.Images, scale.Image{Ref: fmt.Sprintf("registry.example.com/scale/image-%d:v1", i), Size: int64(imageMiB * scale.MiB)})
	}
	opts.Capacity, opts.NodeCap = int64(capMiB*scale.MiB), int64(nodeMiB*scale.MiB)

	var rep *scale.Report
	if from != "" {
		if rep, err = readReports(from); err != nil {
			return err
		}
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		start := time.Now()
		load := bench.MachineLoad()
		if rep, err = scale.Measure(ctx, opts); err != nil {
			return err
		}
		rep.Elapsed, rep.Load = time.Since(start), load
	}
	if jsonFile != "" {
		if err := bench.WriteJSON(jsonFile, rep); err != nil {
			return err
		}
	}
	if before != "" {
		if rep.Before, err = readReports(before); err != nil {
			return err
		}
		rep.BeforeLabel, rep.AfterLabel = beforeLabel, afterLabel
	}
	rep.Command = "make scale"
	if len(os.Args) > 1 {
		rep.Command = "go run ./tests/scale/cmd/scale " + strings.Join(os.Args[1:], " ")
	}
	if err := bench.WriteDocument(out, plotFile, &rep.PlotFile, rep); err != nil {
		return err
	}
	for _, c := range rep.Checks() {
		fmt.Printf("  %-26s %-100s %-20s %s\n", c.Run, c.Target, c.Value, c.Verdict())
	}
	return nil
}

// readReports joins the reports of -json files: their runs in order, the
// time they took together and the load at the start of each.
func readReports(files string) (*scale.Report, error) {
	var out *scale.Report
	var loads []string
	for _, f := range strings.Split(files, ",") {
		rep := &scale.Report{}
		if err := bench.ReadJSON(strings.TrimSpace(f), rep); err != nil {
			return nil, err
		}
		loads = append(loads, rep.Load)
		if out == nil {
			out = rep
			continue
		}
		out.Options.Configs = append(out.Options.Configs, rep.Options.Configs...)
		out.Runs = append(out.Runs, rep.Runs...)
		out.Elapsed += rep.Elapsed
	}
	out.Load = strings.Join(loads, "; ")
	return out, nil
}
