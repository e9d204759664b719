// Package readiness_test runs spec.startupTaint end to end on a real
// cluster (tests/cluster): two nodes at start, and nodes that join later
// with kubelet flags of their own, the way an autoscaler adds capacity with
// a startup taint (--register-with-taints). The instance is rendered with
// the standalone kustomize and the function from ./bin and applied; the
// real DaemonSet controller, scheduler and kubelets run the agent image
// built the way `make oci` builds it.
//
// Run: go test -p 1 -v ./tests/readiness/ (after `make build tools
// host-deps kube`).
package readiness_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

const labelDomain = "image-prefetcher.stackrox.io/"

var (
	c        *cluster.Cluster
	cs       *kubernetes.Clientset
	agentRef string
)

func TestMain(m *testing.M) {
	// Two nodes at start; two more join during the tests.
	os.Exit(cluster.RunMain(m, cluster.Options{Deploys: true, Nodes: 2, LateNodes: 2}, &c))
}

// setup pushes the agent image once and pre-pulls it on the nodes there
// are at start; nodes that join pull it like any new node.
func setup(t *testing.T) {
	t.Helper()
	if c == nil {
		t.Fatal("no cluster: TestMain did not start one")
	}
	if cs != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ref, _, err := c.PushProjectImages(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if err := n.Pull(ctx, ref); err != nil {
			t.Fatalf("pre-pull the agent image on %s: %v", n.Name, err)
		}
	}
	cs, agentRef = client, ref
}

// instance is one ImagePrefetcher, its own namespace, rendered and applied.
type instance struct {
	name, spec string
	manifests  []byte
}

func (in *instance) key() string { return labelDomain + in.name }

// deploy renders an ImagePrefetcher (generator mode, like
// examples/quickstart) with spec (YAML under `spec:`, two-space indented,
// without agent.image) and applies it. The clean-up deletes the DaemonSet
// and waits for its pods to go first, so that every watch removes its label
// with a valid token, then the rest.
func deploy(t *testing.T, name, spec string) *instance {
	t.Helper()
	return deployRefresh(t, name, spec, 0)
}

// deployRefresh is deploy with watch checking every refresh (see
// cluster.ShortenRefresh); 0 keeps the rendered interval.
func deployRefresh(t *testing.T, name, spec string, refresh time.Duration) *instance {
	t.Helper()
	if refresh > 0 {
		spec += "  refreshInterval: 1m\n"
	}
	p := cluster.Prefetcher{
		Name: name, Namespace: name, AgentImage: agentRef, Spec: spec,
		NamespaceLabels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	manifests, err := p.Render(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if refresh > 0 {
		if manifests, err = cluster.ShortenRefresh(manifests, refresh); err != nil {
			t.Fatal(err)
		}
	}
	in := &instance{name: name, spec: spec, manifests: manifests}
	t.Cleanup(func() { remove(t, in) })
	if _, err := c.Apply(ctx, in.manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply %s: %v", name, err)
	}
	t.Logf("deployed instance %s", name)
	return in
}

func remove(t *testing.T, in *instance) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ds := "image-prefetcher-" + in.name
	if err := cs.AppsV1().DaemonSets(in.name).Delete(ctx, ds, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean-up: delete DaemonSet %s: %v", ds, err)
	}
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + in.name}
	_ = cs.CoreV1().Pods(in.name).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	if err := poll(ctx, "pods of "+ds+" gone", func() (bool, string) {
		pods, err := cs.CoreV1().Pods(in.name).List(ctx, sel)
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items))
	}); err != nil {
		t.Errorf("clean-up: %v", err)
	}
	file := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(file, in.manifests, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Command(ctx, "kubectl", "delete", "--ignore-not-found", "--wait=false", "-f", file).CombinedOutput(); err != nil {
		t.Errorf("clean-up: kubectl delete: %v\n%s", err, out)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, in.key(), in.key())
	for _, n := range c.Nodes() {
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Errorf("clean-up: strip %s from %s: %v", in.key(), n.Name, err)
		}
	}
}

// poll calls cond every 200 ms until it returns true or ctx ends.
func poll(ctx context.Context, what string, cond func() (bool, string)) error {
	return cluster.Poll(ctx, 200*time.Millisecond, what, cond)
}

func node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// setTaints replaces a node's taints, as the admin.
func setTaints(t *testing.T, name string, taints ...corev1.Taint) {
	t.Helper()
	b := fmt.Appendf(nil, `{"spec":{"taints":%s}}`, mustJSON(taints))
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitLabel waits for the instance's label on node to be want.
func waitLabel(t *testing.T, in *instance, nodeName, want string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := poll(ctx, fmt.Sprintf("%s=%s on %s", in.key(), want, nodeName), func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return n.Labels[in.key()] == want, fmt.Sprintf("label %q taints %v", n.Labels[in.key()], n.Spec.Taints)
	}); err != nil {
		dumpPods(t, in.name)
		t.Fatal(err)
	}
}

// waitEvent waits for an Event with reason on a Pod of ns and returns it.
func waitEvent(t *testing.T, ns, reason string, timeout time.Duration) corev1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got corev1.Event
	if err := poll(ctx, "Event "+reason+" in "+ns, func() (bool, string) {
		list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Kind == "Pod" {
				got = ev
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(list.Items))
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func events(t *testing.T, ns, reason string) []corev1.Event {
	t.Helper()
	list, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// agentPod is the instance's pod on node.
func agentPod(t *testing.T, in *instance, nodeName string) corev1.Pod {
	t.Helper()
	pods, err := cs.CoreV1().Pods(in.name).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + in.name, FieldSelector: "spec.nodeName=" + nodeName,
	})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the pod of %s on %s: %v (found %d)", in.name, nodeName, err, len(pods.Items))
	}
	return pods.Items[0]
}

// dumpPods logs an instance's pods and their agent logs, to explain a
// failed wait.
func dumpPods(t *testing.T, ns string) {
	pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, ctr := range []string{"fetch", "watch"} {
			out, _ := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr}).DoRaw(context.Background())
			t.Logf("%s/%s logs:\n%s", p.Name, ctr, tail(string(out), 15))
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pushData pushes a not runnable image of random layers under
// readiness/<name>:v1 and returns the reference pods use.
func pushData(t *testing.T, seed int64, name string, sizes ...int64) string {
	t.Helper()
	img, err := ociimage.Data(seed, sizes...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Push(ctx, img, "readiness/"+name+":v1"); err != nil {
		t.Fatal(err)
	}
	return "ghcr.io/readiness/" + name + ":v1"
}
