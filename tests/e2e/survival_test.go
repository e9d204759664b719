package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Scenario 13: `image-prefetcher status` with the admin kubeconfig shows
// both nodes correctly and exits 1 while one node is failed, 0 once both
// are succeeded.
func Test13Status(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 1700, 64<<10, "status-ok", "status-gone")
	one, two := c.Nodes()[0], c.Nodes()[1]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// node-1 has the image already; the registry then loses it, so only
	// node-2 fails.
	if err := one.Pull(ctx, refs[1]); err != nil {
		t.Fatal(err)
	}
	reg := c.Registry()
	reg.Fail(registry.Match{Repo: "e2e/status-gone"}, 404, 0)
	t.Cleanup(reg.ClearFaults)
	d := e.deployWithRefresh(t, instance{Name: "status", Namespace: "e2e-status", Spec: yamlList(refs)}, 3*time.Second)
	e.waitLabel(t, d, one.Name, "succeeded", labelWait)
	e.waitLabel(t, d, two.Name, "failed", labelWait)

	out, code := runStatus(t, ctx, "--instance", d.Name)
	if code != 1 {
		t.Errorf("status exited %d while %s is failed, want 1; output:\n%s", code, two.Name, out)
	}
	rows := statusRows(out)
	// The OWNER column: the agent's namespace and the instance. The
	// PINNED column: these nodes run Debian's containerd 1.6.20, which
	// cannot pin. IMAGE-FS: "NN% (ceiling 80%)", from the agent's own root
	// filesystem (the kubelets' certificates are self-signed).
	owner := d.Namespace + "/" + d.Name
	want := map[string][]string{
		one.Name: {one.Name, d.Name, "succeeded", owner, "2/2", "pinning", "unsupported", "%", "(ceiling", "80%)", "-"},
		two.Name: {two.Name, d.Name, "failed", owner, "1/2", "pinning", "unsupported", "%", "(ceiling", "80%)", refs[1], "(NotFound)"},
	}
	for node, w := range want {
		if fmt.Sprint(maskImageFs(rows[node])) != fmt.Sprint(w) {
			t.Errorf("status row for %s = %q, want %q; output:\n%s", node, rows[node], w, out)
		}
	}
	if len(rows) != 2 {
		t.Errorf("status printed %d node rows, want 2; output:\n%s", len(rows), out)
	}

	logf(t, "the registry has the image again; watch on %s pulls it at its next check", two.Name)
	reg.ClearFaults()
	e.waitLabel(t, d, two.Name, "succeeded", time.Minute)
	out, code = runStatus(t, ctx, "--instance", d.Name)
	if code != 0 {
		t.Errorf("status exited %d with both nodes succeeded, want 0; output:\n%s", code, out)
	}
	rows = statusRows(out)
	for _, n := range c.Nodes() {
		if w := []string{n.Name, d.Name, "succeeded", owner, "2/2", "pinning", "unsupported", "%", "(ceiling", "80%)", "-"}; fmt.Sprint(maskImageFs(rows[n.Name])) != fmt.Sprint(w) {
			t.Errorf("status row for %s = %q, want %q; output:\n%s", n.Name, rows[n.Name], w, out)
		}
	}
}

// Scenario 12: containerd restarted in the middle of a pull (the agent
// reconnects and finishes, without the kubelet restarting it), and the
// apiserver stopped while the agent labels, started again 20 s later (the
// label and the summary are written, nothing is lost).
func Test12Faults(t *testing.T) {
	e := setup(t)
	reg := c.Registry()
	node := c.Nodes()[0]
	onNode := fmt.Sprintf("  nodeSelector:\n    e2e.image-prefetcher.io/node: %s\n", node.Name)
	if node.Labels["e2e.image-prefetcher.io/node"] != node.Name {
		t.Fatalf("%s lacks the label e2e.image-prefetcher.io/node=%s: %v", node.Name, node.Name, node.Labels)
	}

	t.Run("containerd restart", func(t *testing.T) {
		ref := bigImage(t, 1500, 16<<20, "restart")
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		// 16 MB at 2 MB/s: the pull lasts about 8 s.
		reg.ResetStats()
		reg.SetBandwidth(2 << 20)
		t.Cleanup(reg.ClearFaults)
		d := e.deployInstance(t, instance{Name: "restart", Namespace: "e2e-restart", Spec: yamlList([]string{ref}) + onNode})
		waitBytes(t, ctx, reg, 3<<20)
		if ok, err := node.HasImage(ctx, ref); err != nil || ok {
			t.Fatalf("%s already present before the restart (err %v): the pull was not in flight", ref, err)
		}
		logf(t, "restarting %s's containerd in the middle of the pull", node.Name)
		if err := node.RestartContainerd(ctx); err != nil {
			t.Fatal(err)
		}
		reg.SetBandwidth(0)
		st := e.waitLabel(t, d, node.Name, "succeeded", labelWait)
		if st.summary.Present != 1 || len(st.summary.Failed) != 0 {
			t.Errorf("summary %s, want the image present", st.annotation)
		}
		assertImages(t, []*cluster.Node{node}, []string{ref}, true)
		if restarts := fetchRestarts(t, e, d); restarts != 0 {
			t.Errorf("fetch was restarted %d times by the kubelet; the agent should reconnect by itself", restarts)
		}
		gets := 0
		for _, r := range reg.Requests(registry.Match{Repo: "e2e/restart", Kind: registry.Blobs, Method: "GET"}) {
			if r.Bytes > 1<<20 {
				gets++
			}
		}
		if gets < 2 {
			t.Errorf("the registry served the big blob %d times, want the interrupted transfer and a second one", gets)
		}
	})

	t.Run("apiserver outage while labeling", func(t *testing.T) {
		ref := bigImage(t, 1600, 8<<20, "outage")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// 8 MB at 1 MB/s: the pull lasts about 8 s, long enough to stop
		// the apiserver before the agent labels.
		reg.ResetStats()
		reg.SetBandwidth(1 << 20)
		t.Cleanup(reg.ClearFaults)
		d := e.deployInstance(t, instance{Name: "outage", Namespace: "e2e-outage", Spec: yamlList([]string{ref}) + onNode})
		waitBytes(t, ctx, reg, 1<<20)
		logf(t, "stopping the apiserver during the pull")
		if err := c.StopAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		started := false
		defer func() {
			if !started {
				_ = c.StartAPIServer(context.Background())
			}
		}()
		if err := poll(ctx, ref+" pulled on "+node.Name+" (the agent now labels)", func() (bool, string) {
			ok, err := node.HasImage(ctx, ref)
			return ok, fmt.Sprint(err)
		}); err != nil {
			t.Fatal(err)
		}
		logf(t, "pulled while the apiserver is down; starting it again in 20 s")
		outage := time.Now()
		time.Sleep(20 * time.Second)
		if err := c.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		started = true
		logf(t, "apiserver back after %.1fs", time.Since(outage).Seconds())
		st := e.waitLabel(t, d, node.Name, "succeeded", labelWait)
		if st.summary.Total != 1 || st.summary.Present != 1 || len(st.summary.Failed) != 0 {
			t.Errorf("summary %s, want 1/1 present", st.annotation)
		}
		if restarts := fetchRestarts(t, e, d); restarts != 0 {
			t.Errorf("fetch was restarted %d times; it should have kept its result and labeled after the outage", restarts)
			e.previousLogs(t, d, "fetch")
		}
		evs := e.waitEvent(t, d.Namespace, "Prefetched", "Normal")
		logf(t, "Event after the outage: %s", evs[0].Message)
		// The pod goes on to its main container. (The DaemonSet's own
		// status lags behind after an outage, while the controller-manager
		// re-lists; the pod's status is what the kubelet reports.)
		if err := poll(ctx, "the watch container running", func() (bool, string) {
			pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
			if err != nil {
				return false, err.Error()
			}
			for _, p := range pods.Items {
				for _, st := range p.Status.ContainerStatuses {
					if st.Name == "watch" && st.State.Running != nil {
						return true, ""
					}
				}
			}
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}); err != nil {
			t.Fatal(err)
		}
		logf(t, "watch is running")
	})
}

// bigImage pushes a single-layer image of size random bytes as
// e2e/<name>:v1 and returns the reference pods use.
func bigImage(t *testing.T, seed, size int64, name string) string {
	t.Helper()
	img, err := ociimage.Data(seed, size)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Push(ctx, img, "e2e/"+name+":v1"); err != nil {
		t.Fatal(err)
	}
	ref := "ghcr.io/e2e/" + name + ":v1"
	forgetImages(t, ref)
	return ref
}

// waitBytes waits until the registry has sent n bytes since its last
// ResetStats: a blob transfer is under way.
func waitBytes(t *testing.T, ctx context.Context, reg *registry.Registry, n int64) {
	t.Helper()
	if err := poll(ctx, fmt.Sprintf("%d bytes sent by the registry", n), func() (bool, string) {
		s := reg.Stats()
		return s.BytesSent >= n, fmt.Sprintf("%d bytes", s.BytesSent)
	}); err != nil {
		t.Fatal(err)
	}
}

// fetchRestarts sums the restarts of the fetch init containers.
func fetchRestarts(t *testing.T, e env, d *deployed) int32 {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods(d.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, p := range pods.Items {
		for _, st := range p.Status.InitContainerStatuses {
			if st.Name == "fetch" {
				n += st.RestartCount
			}
		}
	}
	return n
}

// previousLogs logs the output of the previous run of container in the
// instance's pods: why it exited, when a restart was not expected.
func (e env) previousLogs(t *testing.T, d *deployed, container string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		for _, st := range p.Status.InitContainerStatuses {
			if st.Name != container || st.RestartCount == 0 {
				continue
			}
			t.Logf("%s/%s last state %+v", p.Name, container, st.LastTerminationState)
			logs, err := e.cs.CoreV1().Pods(d.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container, Previous: true, Timestamps: true}).DoRaw(ctx)
			if err != nil {
				t.Logf("%s/%s previous logs: %v", p.Name, container, err)
				continue
			}
			t.Logf("%s/%s previous run's logs:\n%s", p.Name, container, tailLines(string(logs), 30))
		}
	}
}

// runStatus runs ./bin/image-prefetcher status with the admin kubeconfig
// inside the cluster's network namespace and returns its combined output
// and exit code.
func runStatus(t *testing.T, ctx context.Context, args ...string) (string, int) {
	t.Helper()
	cmd := c.Command(ctx, binPath("image-prefetcher"), append([]string{"status", "--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("run status: %v\n%s", err, out)
		return "", -1
	}
}

// statusRows splits status's table into fields per node.
// maskImageFs replaces the usage of a row's IMAGE-FS cell, "NN% (ceiling
// 80%)", by "%": it follows the host's disk.
func maskImageFs(row []string) []string {
	row = slices.Clone(row)
	if len(row) > 8 && strings.HasSuffix(row[7], "%") && row[8] == "(ceiling" {
		row[7] = "%"
	}
	return row
}

func statusRows(out string) map[string][]string {
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], "node-") {
			rows[f[0]] = f
		}
	}
	return rows
}
