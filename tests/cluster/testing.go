package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

// StartForTest starts a cluster for t and tears it down when t ends,
// failing t if the teardown leaves anything behind. When t failed, the end
// of every component log is written to the test log first.
func StartForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs(t)
		}
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
		if left := c.Leftovers(); len(left) > 0 {
			t.Errorf("teardown left behind:\n  %s", strings.Join(left, "\n  "))
		}
	})
	return c
}

// AgentImage pushes the project's images built in ./bin once per cluster
// (PushProjectImages) and returns the agent's reference, which rendered
// manifests pull unchanged.
func (c *Cluster) AgentImage(t testing.TB) string {
	t.Helper()
	c.agent.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c.agent.ref, _, c.agent.err = c.PushProjectImages(ctx, "")
	})
	if c.agent.err != nil {
		t.Fatalf("push the agent image: %v", c.agent.err)
	}
	return c.agent.ref
}

// Deploy renders an ImagePrefetcher of that name, in a namespace of the
// same name (spec is YAML under spec:, besides agent.image, which is
// AgentImage), through the real kustomize and function, and applies it.
func (c *Cluster) Deploy(t testing.TB, name, spec string) {
	t.Helper()
	p := Prefetcher{Name: name, Namespace: name, AgentImage: c.AgentImage(t), Spec: spec}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	manifests, err := p.Render(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, manifests, ApplyOptions{}); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

// Uninstall deletes the DaemonSets of an instance Deploy made (in the
// namespace of its name) and waits until its pods are gone: their watch
// has settled the label and the pins by then. ctx bounds the wait.
func (c *Cluster) Uninstall(ctx context.Context, t testing.TB, name string) {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	bg := metav1.DeletePropagationBackground
	if err := cs.AppsV1().DaemonSets(name).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &bg}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Poll(ctx, 250*time.Millisecond, "the agent pods of "+name+" gone", func() (bool, string) {
		pods, err := cs.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items))
	}); err != nil {
		t.Fatal(err)
	}
}

// PushData pushes data images of one layer of size bytes, derived from
// seed, as e2e/<name>:v1 and returns how pods name them (ghcr.io, which
// nodes send to the run's registry).
func (c *Cluster) PushData(t testing.TB, seed, size int64, names ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var refs []string
	for i, n := range names {
		img, err := ociimage.Data(seed+int64(i), size)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Push(ctx, img, "e2e/"+n+":v1"); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, "ghcr.io/e2e/"+n+":v1")
	}
	return refs
}

// DumpLogs writes the end of every component log, and of every
// container log the kubelets keep (the agents' included), to the test log.
func (c *Cluster) DumpLogs(t testing.TB) {
	logs, _ := filepath.Glob(c.path("logs", "*.log"))
	for _, n := range c.Nodes() {
		pods, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", "*", "*", "*.log"))
		logs = append(logs, pods...)
	}
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.Size() > 0 {
			t.Logf("---- last lines of %s:\n%s", strings.TrimPrefix(l, c.Dir+"/"), tail(l, 25))
		}
	}
}

// RunMain shares one cluster between every test of a package: it starts
// the cluster, stores it in *c, runs the tests, tears the cluster down and
// returns the exit code (non-zero also when teardown leaves anything
// behind). An interrupt tears the cluster down before exiting.
//
//	var c *cluster.Cluster
//	func TestMain(m *testing.M) { os.Exit(cluster.RunMain(m, cluster.Options{Nodes: 2}, &c)) }
func RunMain(m *testing.M, opts Options, c **Cluster) int {
	if opts.Deploys {
		if err := CheckBinaries(); err != nil {
			fmt.Fprintf(os.Stderr, ">> %v\n", err)
			return 1
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	cl, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "start cluster: %v\n", err)
		return 1
	}
	*c = cl
	var once sync.Once
	stop := func() int {
		code := 0
		once.Do(func() {
			if err := cl.Stop(context.Background()); err != nil {
				fmt.Fprintf(os.Stderr, "stop cluster: %v\n", err)
				code = 1
			}
			if left := cl.Leftovers(); len(left) > 0 {
				fmt.Fprintf(os.Stderr, "teardown left behind:\n  %s\n", strings.Join(left, "\n  "))
				code = 1
			}
		})
		return code
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; ok {
			fmt.Fprintln(os.Stderr, "interrupted: tearing the cluster down")
			stop()
			os.Exit(130)
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(sigs)
	if scode := stop(); code == 0 {
		code = scode
	}
	return code
}
