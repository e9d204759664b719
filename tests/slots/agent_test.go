package slots_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// These tests run the real agent binary (./bin/image-prefetcher, from
// `make build`) against this package's kube-apiserver, with the fake CRI
// server (agent/internal/fakecri/cmd/fakecri) standing in for the runtime.

func agentBinary(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../bin/image-prefetcher")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make build`", p)
	}
	return p
}

// startFakeCRI builds and starts the fake runtime with flags and images,
// and returns its socket and process.
func startFakeCRI(t *testing.T, args ...string) (string, *os.Process) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakecri")
	build := exec.Command("go", "build", "-o", bin, "./agent/internal/fakecri/cmd/fakecri")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fakecri: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "cri.sock")
	cmd := exec.Command(bin, append([]string{"-socket", sock}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	for range 500 {
		if _, err := os.Stat(sock); err == nil {
			return sock, cmd.Process
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the fake CRI did not create its socket")
	return "", nil
}

func (e *testEnv) createNode(t *testing.T, name string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if _, err := e.admin.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// startAgent runs the agent binary in the cluster's network namespace as
// the admin, with the pod's downward-API environment.
func (e *testEnv) startAgent(t *testing.T, ctx context.Context, pod string, args ...string) (*exec.Cmd, *cluster.Output) {
	t.Helper()
	cmd := e.c.Command(ctx, agentBinary(t), append(args[:1:1], append([]string{"--kubeconfig=" + e.c.Kubeconfig}, args[1:]...)...)...)
	cmd.Env = append(cmd.Env, "POD_NAME="+pod, "POD_NAMESPACE="+e.ns, "POD_UID=0b5d9f4e-1c2a-4f5e-9d3b-7a8c6e2f1d00")
	logs := &cluster.Output{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, logs
}

func (e *testEnv) waitFor(t *testing.T, ctx context.Context, what string, logs *cluster.Output, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("gave up waiting for %s; agent logs:\n%s", what, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *testEnv) nodeKey(ctx context.Context, node, key string) (string, string, error) {
	n, err := e.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	return n.Labels[key], n.Annotations[key], nil
}

// testFetchSIGTERM: the DaemonSet controller kills not-ready pods first
// during an update. fetch, terminated while it pulls as the seed holding
// slot 0, gives the slot back within a few seconds, instead of leaving the
// slot held until its lease runs out (15-21 s). A seed cut short has not
// finished: it records no seed, and writes no label.
func (e *testEnv) testFetchSIGTERM(t *testing.T) {
	const instance, node = "sigterm", "node-sigterm"
	e.createNode(t, node)
	sock, _ := startFakeCRI(t, "-stall")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, logs := e.startAgent(t, ctx, "image-prefetcher-sigterm-x7k2p", "fetch", "--cri-socket="+sock, "--node-name="+node, "--instance="+instance,
		"--max-concurrent-nodes=2", "--seed-nodes=1", "--initial-pull-attempt-timeout=10m", "ghcr.io/team/big:1")
	slot0 := slots.SlotName(instance, 0)
	e.waitFor(t, ctx, "fetch holding slot 0", logs, func() bool {
		l, err := e.admin.CoordinationV1().Leases(e.ns).Get(ctx, slot0, metav1.GetOptions{})
		return err == nil && holderOf(l) != "" && strings.Contains(logs.String(), "acquired pull slot")
	})
	time.Sleep(time.Second) // the pull is in flight, stalled
	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	took := time.Since(sent)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("fetch ended with %v, want exit 1 (did not finish)\n%s", err, logs)
	}
	if took > 6*time.Second {
		t.Errorf("fetch took %v to end after SIGTERM", took)
	}
	l, err := e.admin.CoordinationV1().Leases(e.ns).Get(ctx, slot0, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := holderOf(l); h != "" {
		t.Errorf("%s still held by %q %v after SIGTERM; logs:\n%s", slot0, h, took, logs)
	}
	if v, ok := l.Annotations[slots.SeededAnnotation]; ok {
		t.Errorf("a seed terminated before its pull ended recorded %s=%q", slots.SeededAnnotation, v)
	}
	if v, a, err := e.nodeKey(ctx, node, "image-prefetcher.stackrox.io/"+instance); err != nil || v != "" || a != "" {
		t.Errorf("label %q annotation %q (%v) after a cut-short fetch, want none", v, a, err)
	}
	t.Logf("fetch ended %v after SIGTERM; slot 0 released, no seed recorded", took.Round(time.Millisecond))
}

// testWatchWaitingForASlot: an image garbage-collected while every slot is
// held by other nodes. watch waits for a slot to pull it again; meanwhile
// the label says failed (Missing), and a deleted label and a re-created
// Node are repaired. Once a slot is free, the image is pulled and the
// label says succeeded.
func (e *testEnv) testWatchWaitingForASlot(t *testing.T) {
	const instance, node = "gc", "node-gc"
	key := "image-prefetcher.stackrox.io/" + instance
	ref := "ghcr.io/team/app:1"
	e.createNode(t, node)
	sock, cri := startFakeCRI(t, ref)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Another node holds the only slot.
	token := e.agentToken(t, instance, 1)
	other := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "other-node", LeaseDuration: 3 * time.Second})
	busy, err := other.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd, logs := e.startAgent(t, ctx, "image-prefetcher-gc-x7k2p", "watch", "--cri-socket="+sock, "--node-name="+node, "--instance="+instance,
		"--max-concurrent-nodes=1", "--refresh-interval=1s", ref)
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	label := func(want string, missing bool) func() bool {
		return func() bool {
			v, a, err := e.nodeKey(ctx, node, key)
			return err == nil && v == want && a != "" && strings.Contains(a, `"Missing"`) == missing
		}
	}
	e.waitFor(t, ctx, "label succeeded (everything present, no slot needed)", logs, label("succeeded", false))

	if err := cri.Signal(syscall.SIGUSR1); err != nil { // image garbage collection
		t.Fatal(err)
	}
	e.waitFor(t, ctx, "label failed with the image Missing while waiting for the slot", logs, label("failed", true))

	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, key, key)
	if _, err := e.admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, ctx, "a deleted label repaired while waiting", logs, label("failed", true))

	if err := e.admin.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createNode(t, node)
	e.waitFor(t, ctx, "a re-created Node labeled while waiting", logs, label("failed", true))
	if lost(busy) {
		t.Fatal("the other node lost the slot meanwhile; the wait proved nothing")
	}

	busy.Release()
	e.waitFor(t, ctx, "label succeeded once a slot was free and the image pulled", logs, label("succeeded", false))
}
