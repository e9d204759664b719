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
	flag.IntVar(&opts.Parallelism, "parallelism", 4, "agent --parallelism (images at once per node)")
	flag.IntVar(&opts.Procs, "procs", 4, "agents processes to spread the agents over")
	flag.StringVar(&opts.KeepLogs, "keep-logs", "", "copy the apiserver's and the agents' logs into this directory")
	flag.StringVar(&opts.CPUProfiles, "cpu-profiles", "", "write a CPU profile of every agents process into this directory (it must exist)")
	flag.StringVar(&out, "out", "docs/scale.md", "report to write")
	flag.StringVar(&plotFile, "plot", "docs/scale-completion.png", "plot to write (PNG)")
	flag.StringVar(&jsonFile, "json", "", "also write the report's numbers as JSON to this file (for -before of a later run)")
	flag.StringVar(&before, "before", "", "a -json file of an earlier run on other code, shown side by side with this one")
	var beforeLabel, afterLabel string
	flag.StringVar(&beforeLabel, "before-label", "the code before", "what the -before run measured, for the report")
	flag.StringVar(&afterLabel, "after-label", "this code", "what this run measures, for the report")
	flag.Parse()

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

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	load := bench.MachineLoad()
	rep, err := scale.Measure(ctx, opts)
	if err != nil {
		return err
	}
	rep.Elapsed, rep.Load = time.Since(start), load
	if jsonFile != "" {
		if err := bench.WriteJSON(jsonFile, rep); err != nil {
			return err
		}
	}
	if before != "" {
		rep.Before = &scale.Report{}
		if err := bench.ReadJSON(before, rep.Before); err != nil {
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
