// Package interact_test runs features together on one real two-node
// cluster (tests/cluster), the way issue 26 found them undoing each other:
// startup taints of two instances on one node, a rollout that changes the
// list while the new agent image cannot be pulled, names and layerings off
// the default path, a taint that evicts the agent. Every instance is
// rendered with the standalone kustomize and the function from ./bin and
// applied; the real DaemonSet controller, scheduler and kubelets run the
// agent image built the way `make oci` builds it. Assertions read the
// cluster: Node labels, annotations and taints through watches, Events,
// the registry's view of the pulls, the slot Leases and the agents' logs,
// and the pins and marks on the nodes' containerd (2.4.2) image records.
//
// The cases of TestCases share the cluster and run in parallel, each on
// its own instances, namespaces, taint keys and images; a new case is a
// function added to cases. A case that needs the whole cluster (an
// apiserver outage) is a Test function of its own after TestCases, and
// runs alone once they are done.
//
// Run: go test -p 1 -v ./tests/interact/ (after `make build tools
// host-deps kube`).
package interact_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

const labelDomain = "image-prefetcher.stackrox.io/"

var c *cluster.Cluster

func TestMain(m *testing.M) {
	// containerd 2.x, which pins (Debian's 1.6.20 cannot).
	opts := cluster.Options{Deploys: true, Nodes: 2, NodeRuntime: func(int) cluster.Runtime { return cluster.Containerd2 }}
	os.Exit(cluster.RunMain(m, opts, &c))
}

// cases share the cluster, in parallel.
var cases = []struct {
	name string
	run  func(t *testing.T)
}{
	{"StartupTaintsOfSameNameInstances", startupTaintsOfSameNameInstances},
	{"SharedTaintKey", sharedTaintKey},
	{"RolloutKeepsTheKey", rolloutKeepsTheKey},
	{"RolloutChangingTheListWithoutAnAgent", rolloutChangingTheListWithoutAnAgent},
	{"UntoleratedNoExecuteTaint", untoleratedNoExecuteTaint},
	{"ReferenceManifestLabels", referenceManifestLabels},
	{"NamespaceAboveTheFunctionIsRefused", namespaceAboveTheFunctionIsRefused},
}

// TestCases runs the cases that share the cluster, in parallel.
func TestCases(t *testing.T) {
	setup(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

// TestAPIOutage stops the apiserver: it runs after TestCases, alone.
func TestAPIOutage(t *testing.T) {
	setup(t)
	herdWithMetricsThroughAnAPIOutage(t)
}

var (
	setupOnce sync.Once
	cs        *kubernetes.Clientset
	agentRef  string
	setupErr  error
)

// setup pushes the agent image once and pre-pulls it on both nodes, so
// that only the images under test are pulled during a case.
func setup(t *testing.T) {
	t.Helper()
	if c == nil {
		t.Fatal("no cluster: TestMain did not start one")
	}
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if cs, setupErr = c.Clientset(); setupErr != nil {
			return
		}
		if agentRef, _, setupErr = c.PushProjectImages(ctx, ""); setupErr != nil {
			return
		}
		for _, n := range c.Nodes() {
			if setupErr = n.Pull(ctx, agentRef); setupErr != nil {
				return
			}
		}
	})
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
}

// nodeName is the name of the cluster's node i (0-based), and nodeSpec
// pins an instance to it.
func nodeName(i int) string { return c.Nodes()[i].Name }

func nodeSpec(i int) string {
	return fmt.Sprintf("  nodeSelector:\n    e2e.image-prefetcher.io/node: %s\n", nodeName(i))
}

// instance is one ImagePrefetcher in a namespace of its own, rendered in
// generator mode, and what applying it created.
type instance struct {
	name, namespace string
	// spec is YAML under spec: besides agent.image, two-space indented.
	spec string
	// above, when set, is the body of a kustomization that includes the
	// rendered one (a namePrefix or namespace above the function).
	above string
	// agentImage overrides the pushed agent image.
	agentImage string
	// refresh, when set, is watch's check interval (spec must hold
	// refreshInterval: 1m; see cluster.ShortenRefresh).
	refresh time.Duration
	// forceRemove deletes the pods without a grace period: after an
	// apiserver outage the kubelets take most of a minute to catch up
	// with a graceful deletion, while the other cases wait.
	forceRemove bool
	dir         string
	manifests   []byte
}

func (in *instance) key() string { return labelDomain + in.name }

// render writes the kustomization (again, with the current spec) and
// builds it with the real kustomize.
func (in *instance) render(t *testing.T) []byte {
	t.Helper()
	if in.dir == "" {
		in.dir = t.TempDir()
	}
	img := agentRef
	if in.agentImage != "" {
		img = in.agentImage
	}
	p := cluster.Prefetcher{
		Name: in.name, Namespace: in.namespace, AgentImage: img, Spec: in.spec,
		NamespaceLabels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"},
	}
	gen := filepath.Join(in.dir, "gen")
	if err := os.MkdirAll(gen, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(gen); err != nil {
		t.Fatal(err)
	}
	dir := gen
	if in.above != "" {
		dir = in.dir
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte("resources:\n- gen\n"+in.above), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := cluster.Kustomize(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if in.refresh > 0 {
		if out, err = cluster.ShortenRefresh(out, in.refresh); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// deploy renders and applies in; the clean-up removes it.
func deploy(t *testing.T, in *instance) *instance {
	t.Helper()
	in.manifests = in.render(t)
	t.Cleanup(func() { remove(t, in) })
	apply(t, in.manifests)
	t.Logf("deployed %s/%s", in.namespace, in.name)
	return in
}

// update renders in again with its current fields and applies it.
func update(t *testing.T, in *instance) {
	t.Helper()
	in.manifests = in.render(t)
	apply(t, in.manifests)
}

func apply(t *testing.T, manifests []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

// remove deletes the instance's DaemonSet and waits for its pods to go
// (so that every watch settles its key with a valid token), then the rest,
// then strips any key of the instance still on a node.
func remove(t *testing.T, in *instance) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + in.name}
	if err := cs.AppsV1().DaemonSets(in.namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean-up: delete the DaemonSet of %s: %v", in.name, err)
	}
	del := metav1.DeleteOptions{}
	if in.forceRemove {
		del.GracePeriodSeconds = new(int64)
	}
	_ = cs.CoreV1().Pods(in.namespace).DeleteCollection(ctx, del, sel)
	// On a watch: done when the informer's store of the pods is empty.
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", in.namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = sel.LabelSelector
	})
	var pods cache.Store
	if _, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(store cache.Store) (bool, error) {
		pods = store
		return len(store.List()) == 0, nil
	}, func(watch.Event) (bool, error) {
		return len(pods.List()) == 0, nil
	}); err != nil {
		t.Errorf("clean-up: pods of %s not gone: %v", in.name, err)
	}
	file := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(file, in.manifests, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Command(ctx, "kubectl", "delete", "--ignore-not-found", "--wait=false", "-f", file).CombinedOutput(); err != nil {
		t.Errorf("clean-up: kubectl delete: %v\n%s", err, out)
	}
	stripKey(t, in.key())
}

func stripKey(t *testing.T, key string) {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, key, key)
	for _, n := range c.Nodes() {
		if _, err := cs.CoreV1().Nodes().Patch(context.Background(), n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Errorf("clean-up: strip %s from %s: %v", key, n.Name, err)
		}
	}
}

// taintNode adds a taint to node i, as a node group registers it, and
// removes it again when the test ends (if it is still there).
func taintNode(t *testing.T, i int, tt corev1.Taint) {
	t.Helper()
	name := nodeName(i)
	editTaints(t, name, func(ts []corev1.Taint) []corev1.Taint { return append(ts, tt) })
	t.Cleanup(func() {
		editTaints(t, name, func(ts []corev1.Taint) []corev1.Taint {
			var keep []corev1.Taint
			for _, x := range ts {
				if x.Key != tt.Key {
					keep = append(keep, x)
				}
			}
			return keep
		})
	})
}

// editTaints changes a node's taints with a JSON patch that tests the list
// it read, so that cases tainting the same node at once never lose each
// other's taints.
func editTaints(t *testing.T, node string, edit func([]corev1.Taint) []corev1.Taint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		old, _ := json.Marshal(n.Spec.Taints)
		nw, _ := json.Marshal(edit(n.Spec.Taints))
		patch := fmt.Sprintf(`[{"op":"test","path":"/spec/taints","value":%s},{"op":"add","path":"/spec/taints","value":%s}]`, old, nw)
		if len(n.Spec.Taints) == 0 {
			patch = fmt.Sprintf(`[{"op":"add","path":"/spec/taints","value":%s}]`, nw)
		}
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) {
			t.Fatalf("edit the taints of %s: %v", node, err)
		}
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// until watches what lw lists, of the type of obj, until cond holds for
// one of them, and returns it; ctx bounds the wait.
func until[T runtime.Object](ctx context.Context, lw cache.ListerWatcher, obj T, cond func(T) bool) (T, error) {
	ev, err := watchtools.UntilWithSync(ctx, lw, obj, nil, func(ev watch.Event) (bool, error) {
		o, ok := ev.Object.(T)
		return ok && cond(o), nil
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return ev.Object.(T), nil
}

// waitNode waits, on a watch of the node, until cond holds, and returns
// the node as it then was. what says what is awaited; the last state cond
// described is in the error.
func waitNode(t *testing.T, name, what string, timeout time.Duration, cond func(*corev1.Node) (bool, string)) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", name))
	last := ""
	n, err := until(ctx, lw, &corev1.Node{}, func(n *corev1.Node) bool {
		done, state := cond(n)
		if state != last {
			last = state
			t.Logf("%s: %s", name, state)
		}
		return done
	})
	if err != nil {
		t.Fatalf("waiting for %s on %s: %v (last: %s)", what, name, err, last)
	}
	return n
}

// keyState describes an instance's key and a taint on a node, for logs.
func keyState(n *corev1.Node, key, taintKey string) string {
	s := fmt.Sprintf("label %q", n.Labels[key])
	if taintKey != "" {
		s += fmt.Sprintf(", taint %s present %v", taintKey, cluster.HasTaint(n, taintKey))
	}
	return s
}

// keyWatch records every value the instance's label takes on a node, from
// the moment it starts, through a watch; "" is the key gone.
type keyWatch struct {
	mu     sync.Mutex
	values []string
	stop   context.CancelFunc
	done   chan struct{}
}

func watchKey(t *testing.T, node, key string) *keyWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &keyWatch{stop: cancel, done: make(chan struct{})}
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", node))
	started := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(w.done)
		_, _ = watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, func(store cache.Store) (bool, error) {
			once.Do(func() { close(started) })
			return false, nil
		}, func(ev watch.Event) (bool, error) {
			if n, ok := ev.Object.(*corev1.Node); ok {
				w.mu.Lock()
				if v := n.Labels[key]; len(w.values) == 0 || w.values[len(w.values)-1] != v {
					w.values = append(w.values, v)
				}
				w.mu.Unlock()
			}
			return false, nil
		})
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the node watch did not start")
	}
	return w
}

// finish stops the watch and returns the values seen.
func (w *keyWatch) finish() []string {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.values
}

// podsOf lists the instance's pods.
func podsOf(t *testing.T, in *instance) []corev1.Pod {
	t.Helper()
	pods, err := cs.CoreV1().Pods(in.namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + in.name})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// waitEvent waits for an Event of reason on a Pod of ns, on a watch.
func waitEvent(t *testing.T, ns, reason string, timeout time.Duration) corev1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "events", ns, fields.OneTermEqualSelector("reason", reason))
	e, err := until(ctx, lw, &corev1.Event{}, func(e *corev1.Event) bool { return e.InvolvedObject.Kind == "Pod" })
	if err != nil {
		dumpPods(t, ns)
		t.Fatalf("waiting for an Event %s in %s: %v", reason, ns, err)
	}
	return *e
}

// dumpPods logs a namespace's pods and the ends of their agents' logs.
func dumpPods(t *testing.T, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			t.Logf("  %s: restarts %d state %+v", st.Name, st.RestartCount, st.State)
			out, _ := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: st.Name}).DoRaw(ctx)
			t.Logf("  %s logs:\n%s", st.Name, tail(string(out), 12))
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// pinBudget is spec YAML for a pin budget in bytes: the default, a share
// of the image filesystem, needs its capacity, which the agent reads
// through a mount of the node's path that the harness's nodes lack.
const pinBudget = "  pin:\n    budget: 64Mi\n"

// pinOf is ref's pin on node i: whether the CRI reports the image pinned
// (what the kubelet's image GC reads), and the labels of its containerd
// record (the pin, and the mark of each instance that pinned it).
func pinOf(t *testing.T, i int, ref string) (pinned bool, labels map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := c.Nodes()[i]
	img, err := n.Image(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if img == nil {
		t.Fatalf("%s is not on %s", ref, n.Name)
	}
	if labels, err = n.ImageLabels(ctx, ref); err != nil {
		t.Fatal(err)
	}
	return img.GetPinned(), labels
}

// pinsImages holds when the instance's annotation says its images are
// pinned, n of them: the check that wrote it had set the pins.
func pinsImages(n *corev1.Node, key string, want int) bool {
	s, err := label.Parse(n.Annotations[key])
	return err == nil && s.Pins != nil && s.Pins.Images == want
}

// images is spec YAML listing refs.
func images(refs ...string) string {
	return "  images:\n  - " + strings.Join(refs, "\n  - ") + "\n"
}
