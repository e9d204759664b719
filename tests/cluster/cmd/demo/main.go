// Command demo is `make demo` and `make demo-down`: it brings up the local
// 2-node cluster of tests/cluster (through the cluster CLI, so the cluster
// outlives it), deploys examples/quickstart exactly as its README says, waits
// for every node to be labeled and shows the result.
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
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
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

	step("rendering %s: kustomize build --enable-alpha-plugins --enable-exec .", relPath(f.example))
	rendered, err := render(ctx, f)
	if err != nil {
		return err
	}
	objs, err := decode(rendered)
	if err != nil {
		return err
	}
	instance, namespace, images, err := describe(objs)
	if err != nil {
		return err
	}
	if err := pushStandIns(ctx, c, images, version.AgentImage()); err != nil {
		return err
	}

	step("applying it: kubectl apply --server-side -f -")
	apply := c.Command(ctx, "kubectl", "apply", "--server-side", "--force-conflicts", "-f", "-")
	apply.Stdin, apply.Stdout, apply.Stderr = bytes.NewReader(rendered), os.Stdout, os.Stderr
	if err := apply.Run(); err != nil {
		return fmt.Errorf("kubectl apply: %w", err)
	}

	key := v1alpha1.LabelDomain + "/" + instance
	step("waiting up to %s for every node to carry the label %s", f.timeout, key)
	if err := waitLabeled(ctx, c, namespace, key, f.timeout); err != nil {
		return err
	}

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

// render runs the standalone kustomize from the example's directory, as
// the example's README does; image-prefetcher-fn is found on PATH.
func render(ctx context.Context, f upFlags) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(f.binDir, "kustomize"), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	cmd.Dir = f.example
	cmd.Env = append(os.Environ(), "PATH="+f.binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kustomize build in %s: %w: %s", f.example, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func decode(manifests []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("decode rendered manifests: %w", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// describe finds the instance name (the DaemonSet's INSTANCE_NAME), its
// namespace and the image list in the rendered output.
func describe(objs []*unstructured.Unstructured) (instance, namespace string, images []string, err error) {
	var listText string
	for _, o := range objs {
		switch o.GetKind() {
		case "DaemonSet":
			namespace = o.GetNamespace()
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				env, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
				for _, e := range env {
					em := e.(map[string]any)
					if em["name"] == "INSTANCE_NAME" {
						instance, _ = em["value"].(string)
					}
				}
			}
		case "ConfigMap":
			if s, ok, _ := unstructured.NestedString(o.Object, "data", "images.txt"); ok {
				listText = s
			}
		}
	}
	if instance == "" || namespace == "" {
		return "", "", nil, errors.New("the rendered output has no DaemonSet with an INSTANCE_NAME env var")
	}
	if listText == "" {
		return "", "", nil, errors.New("the rendered output has no image-list ConfigMap (key images.txt)")
	}
	list := imagelist.Parse(listText)
	for _, e := range list.Invalid() {
		return "", "", nil, fmt.Errorf("rendered image list: %w", e.Err)
	}
	return instance, namespace, list.Refs(), nil
}

// pushStandIns gives every listed image that the cluster's registry does
// not already serve a small image under that name: the cluster has no way
// out to docker.io, but its containerd resolves docker.io, ghcr.io,
// registry.k8s.io, ... to the run's own registry.
func pushStandIns(ctx context.Context, c *cluster.Cluster, images []string, agentRef string) error {
	var names []string
	for i, ref := range images {
		full, err := imagelist.Normalize(ref)
		if err != nil {
			return err
		}
		if full == cluster.PauseImage || full == agentRef {
			continue
		}
		host, err := imagelist.Host(full)
		if err != nil {
			return err
		}
		repoTag, ok := strings.CutPrefix(full, host+"/")
		if !ok || !mirrored(host) || strings.Contains(repoTag, "@") {
			return fmt.Errorf("image %s: the demo registry serves only tagged images on %s", ref, strings.Join(cluster.MirroredHosts, ", "))
		}
		img, err := standIn(ctx, full, int64(i))
		if err != nil {
			return err
		}
		if err := c.Push(ctx, img, repoTag); err != nil {
			return fmt.Errorf("push stand-in for %s: %w", ref, err)
		}
		names = append(names, full)
	}
	if len(names) > 0 {
		sort.Strings(names)
		step("pushed small runnable stand-in images (this cluster has no Internet) as %s", strings.Join(names, ", "))
	}
	return nil
}

// standIn is a small runnable image named for ref: the harness's pause
// binary (it sleeps until SIGTERM) and 2 MB of data that differ per image,
// so that a workload using the prefetched label can really run here.
func standIn(ctx context.Context, ref string, seed int64) (v1.Image, error) {
	pause, err := cluster.PauseBinary(ctx)
	if err != nil {
		return nil, fmt.Errorf("stand-in for %s: %w", ref, err)
	}
	data := make([]byte, 2<<20)
	_, _ = rand.New(rand.NewSource(1000 + seed)).Read(data)
	spec := ociimage.Binary(pause, "65534:65534")
	spec.Files = append(spec.Files, ociimage.File{Path: "/usr/share/stand-in/data.bin", Data: data, Mode: 0o644})
	spec.Labels = map[string]string{"org.opencontainers.image.description": "image-prefetcher demo stand-in for " + ref}
	img, err := ociimage.Build(spec)
	if err != nil {
		return nil, fmt.Errorf("stand-in for %s: %w", ref, err)
	}
	return img, nil
}

func mirrored(host string) bool {
	for _, h := range cluster.MirroredHosts {
		if h == host {
			return true
		}
	}
	return false
}

// waitLabeled polls until every node has the label, printing progress
// every 10 s, and on timeout says which nodes lack it and why.
func waitLabeled(ctx context.Context, c *cluster.Cluster, namespace, key string, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	lastReport := start
	var missing []string
	var pods string
	for {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			missing = missing[:0]
			var done []string
			for _, n := range nodes.Items {
				if v, ok := n.Labels[key]; ok {
					done = append(done, n.Name+"="+v)
				} else {
					missing = append(missing, n.Name)
				}
			}
			if len(nodes.Items) > 0 && len(missing) == 0 {
				step("every node is labeled after %s: %s", time.Since(start).Round(time.Second), strings.Join(done, ", "))
				return nil
			}
		}
		pods = podSummary(ctx, c, namespace)
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			step("still waiting (%s): not labeled yet: %s; pods: %s", time.Since(start).Round(time.Second), strings.Join(missing, ", "), pods)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s, nodes %s still have no label %s (pods in %s: %s); see `IMAGE_PREFETCHER_E2E_DIR=%s ./bin/cluster kubectl describe pods -n %s` and the logs in %s/logs",
				timeout, strings.Join(missing, ", "), key, namespace, pods, os.Getenv("IMAGE_PREFETCHER_E2E_DIR"), namespace, c.Dir)
		case <-time.After(2 * time.Second):
		}
	}
}

func podSummary(ctx context.Context, c *cluster.Cluster, namespace string) string {
	cs, err := c.Clientset()
	if err != nil {
		return err.Error()
	}
	list, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	if len(list.Items) == 0 {
		return "none yet"
	}
	var out []string
	for _, p := range list.Items {
		out = append(out, fmt.Sprintf("%s on %s %s", p.Name, p.Spec.NodeName, podState(p)))
	}
	return strings.Join(out, ", ")
}

// podState is roughly what kubectl's STATUS column says.
func podState(p corev1.Pod) string {
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" {
			return w.Reason
		}
		if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("%s (exit %d)", t.Reason, t.ExitCode)
		}
	}
	return string(p.Status.Phase)
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
