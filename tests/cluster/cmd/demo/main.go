// Command demo is `make demo` and `make demo-down`: it brings up the local
// 2-node cluster of tests/cluster (through the cluster CLI, so the cluster
// outlives it), deploys examples/quickstart exactly as its README says, waits
// for every node to be labeled and shows the result. The deployment itself
// is tests/cluster/demo.Deploy, which the e2e scenario 14 runs too.
//
//	demo up   [-cluster bin/cluster] [-example examples/quickstart] [-timeout 5m]
//	demo down [-cluster bin/cluster]
//
// The demo's runs live under their own base directory ($IMAGE_PREFETCHER_DEMO_DIR,
// default /tmp/ipf-demo), which it hands to the cluster CLI as
// $IMAGE_PREFETCHER_E2E_DIR, so that nothing it does (reuse, `down -all`)
// can touch a test's or a benchmark's run under /tmp/ipf-e2e.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
)

// DefaultBaseDir keeps demo runs apart from test runs (/tmp/ipf-e2e).
const DefaultBaseDir = "/tmp/ipf-demo"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demo up|down [flags]")
		os.Exit(2)
	}
	base := os.Getenv("IMAGE_PREFETCHER_DEMO_DIR")
	if base == "" {
		base = DefaultBaseDir
	}
	if abs, err := filepath.Abs(base); err != nil || abs == "/tmp/ipf-e2e" {
		fmt.Fprintf(os.Stderr, "demo: IMAGE_PREFETCHER_DEMO_DIR=%s: want a directory of the demo's own, not the tests' /tmp/ipf-e2e\n", base)
		os.Exit(2)
	}
	// Set unconditionally: an IMAGE_PREFETCHER_E2E_DIR exported for tests
	// must not make `down -all` reach their runs.
	os.Setenv("IMAGE_PREFETCHER_E2E_DIR", base)
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: demo up|down [flags]")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf(">> "+format+"\n", args...)
}

// run runs a command with the demo's terminal as its output.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

type upFlags struct {
	clusterBin, example, agentLayout, binDir string
	timeout                                  time.Duration
}

func up(args []string) error {
	var f upFlags
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	fs.StringVar(&f.clusterBin, "cluster", "bin/cluster", "the cluster CLI (go build ./tests/cluster/cmd/cluster)")
	fs.StringVar(&f.example, "example", "examples/quickstart", "the example to render and apply")
	fs.StringVar(&f.agentLayout, "agent-layout", "out/oci/image-prefetcher", "the agent image as `make oci` writes it")
	fs.StringVar(&f.binDir, "bin", "bin", "where kustomize, image-prefetcher and image-prefetcher-fn are")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long to wait for every node to be labeled")
	_ = fs.Parse(args)
	for _, p := range []*string{&f.clusterBin, &f.example, &f.agentLayout, &f.binDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("resolve %s: %w", *p, err)
		}
		*p = abs
	}
	for _, need := range []struct{ path, how string }{
		{f.clusterBin, "go build -o bin/cluster ./tests/cluster/cmd/cluster"},
		{filepath.Join(f.binDir, "kustomize"), "make tools"},
		{filepath.Join(f.binDir, "image-prefetcher"), "make build"},
		{filepath.Join(f.binDir, "image-prefetcher-fn"), "make build"},
		{filepath.Join(f.agentLayout, "index.json"), "make oci"},
	} {
		if _, err := os.Stat(need.path); err != nil {
			return fmt.Errorf("%s is missing: run `%s` (or just `make demo`)", need.path, need.how)
		}
	}
	ctx := context.Background()
	start := time.Now()

	// The agent is pushed under the reference the function renders by
	// default, so the example renders unchanged.
	agentRepoTag, ok := strings.CutPrefix(version.AgentImage(), "ghcr.io/")
	if !ok {
		return fmt.Errorf("default agent image %s is not on ghcr.io, which the cluster's registry serves", version.AgentImage())
	}
	c, reused, err := ensureCluster(ctx, f, agentRepoTag)
	if err != nil {
		return err
	}

	d, err := demo.Deploy(ctx, c, demo.Options{
		BinDir: f.binDir, Example: f.example, AgentRef: version.AgentImage(), Timeout: f.timeout,
		Out: os.Stdout, Progress: step,
	})
	if err != nil {
		// kubectl reaches this cluster only through the cluster CLI.
		return fmt.Errorf("%w\n(run kubectl as IMAGE_PREFETCHER_E2E_DIR=%s %s kubectl ...)", err, os.Getenv("IMAGE_PREFETCHER_E2E_DIR"), relPath(f.clusterBin))
	}
	key, namespace := d.Key, d.Namespace

	fmt.Println()
	step("%s kubectl get nodes -L %s", relPath(f.clusterBin), key)
	if err := run(ctx, f.clusterBin, "kubectl", "-run", c.ID, "get", "nodes", "-L", key); err != nil {
		return err
	}
	fmt.Println()
	step("image-prefetcher status   (./bin/image-prefetcher, admin kubeconfig %s)", c.Kubeconfig)
	statusErr := run(ctx, f.clusterBin, "exec", "-run", c.ID, "--", filepath.Join(f.binDir, "image-prefetcher"), "status")

	how := "started"
	if reused {
		how = "reused (it was already running)"
	}
	fmt.Printf(`
Use the label to schedule a workload only where its images are already present
(an excerpt of a Deployment; the same goes for any pod template):

  spec:
    template:
      spec:
        nodeSelector:
          %[1]s: succeeded
        containers:
        - name: web
          image: docker.io/library/nginx:1.27

Explore the cluster (%[2]s; state and logs in %[3]s):

  export IMAGE_PREFETCHER_E2E_DIR=%[4]s   # the demo's runs, apart from the tests' ones
  %[6]s env                      # KUBECONFIG and the network namespace to enter
  %[6]s kubectl get ds,pods -n %[5]s -o wide
  %[6]s kubectl get node node-1 -o yaml       # the label and the summary annotation
  %[6]s exec -- ./bin/image-prefetcher status -o json

Tear it down, leaving nothing behind:   make demo-down

Demo ready in %[7]s.
`, key, how, c.Dir, os.Getenv("IMAGE_PREFETCHER_E2E_DIR"), namespace, relPath(f.clusterBin), time.Since(start).Round(time.Second))
	if statusErr != nil {
		return fmt.Errorf("image-prefetcher status reports a node that is not succeeded (see above): %w", statusErr)
	}
	return nil
}

func relPath(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return "./" + r
		}
	}
	return p
}

// ensureCluster reuses the demo's running cluster if its API server answers,
// and otherwise tears down whatever demo run is left and starts a new one.
func ensureCluster(ctx context.Context, f upFlags, agentRepoTag string) (*cluster.Cluster, bool, error) {
	if r, err := cluster.FindRun("", ""); err == nil {
		c, err := cluster.Attach(r.Dir)
		if err == nil {
			err = ping(ctx, c)
		}
		if err == nil {
			step("reusing the demo cluster %s (already running; `make demo-down` removes it)", r.ID)
			// A rebuilt agent gets the same tag; pods that already run keep
			// the old one until `make demo-down demo`.
			if err := run(ctx, f.clusterBin, "push", "-run", r.ID, f.agentLayout, agentRepoTag); err != nil {
				return nil, false, err
			}
			return c, true, nil
		}
		step("the demo cluster %s does not answer (%v): tearing it down and starting over", r.ID, err)
	}
	// Removes demo runs whose owner is gone, and any that did not answer.
	if runs, _ := cluster.Runs(""); len(runs) > 0 {
		if err := run(ctx, f.clusterBin, "down", "-all"); err != nil {
			return nil, false, err
		}
	}
	step("starting a 2-node cluster in the background (kube-apiserver, etcd, controller-manager, scheduler, 2 x kubelet + containerd)")
	if err := run(ctx, f.clusterBin, "up", "-nodes", "2", "-push", f.agentLayout+"="+agentRepoTag); err != nil {
		return nil, false, err
	}
	r, err := cluster.FindRun("", "")
	if err != nil {
		return nil, false, fmt.Errorf("cluster up returned but no running demo cluster is found: %w", err)
	}
	c, err := cluster.Attach(r.Dir)
	if err != nil {
		return nil, false, err
	}
	return c, false, nil
}

func ping(ctx context.Context, c *cluster.Cluster) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	if len(nodes.Items) != len(c.Nodes()) {
		return fmt.Errorf("%d nodes registered, want %d", len(nodes.Items), len(c.Nodes()))
	}
	return nil
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	clusterBin := fs.String("cluster", "bin/cluster", "the cluster CLI")
	_ = fs.Parse(args)
	ctx := context.Background()
	runs, err := cluster.Runs("")
	if err != nil {
		return err
	}
	// Attach to the live runs first: their state (nodes, cgroups, netns)
	// is what the leftovers check needs once they are gone.
	var live []*cluster.Cluster
	for _, r := range runs {
		if c, err := cluster.Attach(r.Dir); err == nil {
			live = append(live, c)
		}
	}
	if len(runs) == 0 {
		step("no demo cluster under %s", os.Getenv("IMAGE_PREFETCHER_E2E_DIR"))
	} else if err := run(ctx, *clusterBin, "down", "-all"); err != nil {
		return err
	}
	var left []string
	for _, c := range live {
		for _, l := range c.Leftovers() {
			left = append(left, c.ID+": "+l)
		}
	}
	if rest, _ := cluster.Runs(""); len(rest) > 0 {
		for _, r := range rest {
			left = append(left, "run directory "+r.Dir)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("tear-down left things behind:\n  %s", strings.Join(left, "\n  "))
	}
	base := os.Getenv("IMAGE_PREFETCHER_E2E_DIR")
	if err := os.Remove(base); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove %s: %w", base, err)
	}
	step("demo torn down; leftovers check: nothing left (processes, mounts, cgroups, CNI results, network namespace, run directory)")
	return nil
}
