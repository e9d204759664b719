// Package e2e_test runs the product end to end on a real two-node cluster
// (tests/cluster): every scenario writes a kustomization, renders it with
// the standalone `kustomize build --enable-alpha-plugins --enable-exec` and
// the function from ./bin, applies the output, and lets the real DaemonSet
// controller, scheduler and kubelets run the agent image built the way
// `make oci` builds it. Assertions read the cluster's real state: Node
// labels and annotations through the API, images through each node's CRI,
// and Events.
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/e2e/ (after `make build
// tools host-deps kube`).
package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

// labelDomain prefixes every instance's node label and annotation key.
const labelDomain = "image-prefetcher.stackrox.io/"

var c *cluster.Cluster

func TestMain(m *testing.M) {
	// Fail before the cluster starts when a tool is missing: a scenario that
	// cannot run is a failure, never a skip.
	if err := checkTools(); err != nil {
		fmt.Fprintf(os.Stderr, ">> e2e: %v\n", err)
		os.Exit(1)
	}
	progress("e2e: starting a 2-node cluster")
	os.Exit(cluster.RunMain(m, cluster.Options{Nodes: 2}, &c))
}

// progress prints a `>> ` line to stderr right away. `make e2e` runs
// `go test -p 1 -v`, which streams every package's output as it comes, so
// these lines (like the t.Logf lines of -v) show where a long run is and a
// long wait never looks hung.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, ">> "+format+"\n", args...)
}

// repoRoot is the repository this test runs in.
func repoRoot() string {
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(bin)
}

func binPath(name string) string { return filepath.Join(repoRoot(), "bin", name) }

func checkTools() error {
	for name, how := range map[string]string{
		"kustomize":           "run `make tools` (the standalone kustomize v5 in ./bin)",
		"image-prefetcher-fn": "run `make build` (the function in ./bin)",
		"image-prefetcher":    "run `make build` (the agent in ./bin)",
	} {
		fi, err := os.Stat(binPath(name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable: %s", binPath(name), how)
		}
	}
	return nil
}

// env is what every scenario shares: the cluster's clients and the pushed
// agent image.
type env struct {
	cs       *kubernetes.Clientset
	dyn      dynamic.Interface
	agentRef string
}

var (
	setupOnce sync.Once
	shared    env
	setupErr  error
)

// setup pushes the agent image (built from ./bin as `make oci` builds it)
// once, and pre-pulls it on every node so that a scenario's registry faults
// and bandwidth caps only touch the images under test.
func setup(t *testing.T) env {
	t.Helper()
	if c == nil {
		t.Fatal("no cluster: TestMain did not start one")
	}
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cfg, err := c.RESTConfig()
		if err != nil {
			setupErr = err
			return
		}
		if shared.cs, err = kubernetes.NewForConfig(cfg); err != nil {
			setupErr = err
			return
		}
		if shared.dyn, err = dynamic.NewForConfig(cfg); err != nil {
			setupErr = err
			return
		}
		progress("e2e: pushing the agent image built from ./bin (the `make oci` path)")
		if shared.agentRef, _, err = c.PushProjectImages(ctx, ""); err != nil {
			setupErr = err
			return
		}
		for _, n := range c.Nodes() {
			if err := n.Pull(ctx, shared.agentRef); err != nil {
				setupErr = fmt.Errorf("pre-pull the agent image: %w", err)
				return
			}
		}
	})
	if setupErr != nil {
		t.Fatalf("e2e setup: %v", setupErr)
	}
	return shared
}

// logf logs to the test (streamed with -v) so that progress is visible.
func logf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf(format, args...)
}

// instance describes one ImagePrefetcher a scenario renders.
type instance struct {
	Name      string
	Namespace string
	// Spec is the YAML under `spec:` except agent.image, which is added,
	// indented by two spaces.
	Spec string
	// Resources are extra files (name -> content) listed as resources.
	Resources map[string]string
	// SharedNamespace leaves the namespace in place on clean-up: another
	// instance of the scenario lives in it too.
	SharedNamespace bool
}

// kustomization writes a generator-mode kustomization (like
// examples/quickstart) for in into a new directory and returns it.
func (e env) kustomization(t *testing.T, dir string, in instance) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	p := cluster.Prefetcher{
		Name: in.Name, Namespace: in.Namespace, AgentImage: e.agentRef, Spec: in.Spec,
		NamespaceLabels: map[string]string{
			"pod-security.kubernetes.io/enforce": "privileged",
			"pod-security.kubernetes.io/audit":   "privileged",
			"pod-security.kubernetes.io/warn":    "privileged",
		},
		Resources: in.Resources,
	}
	if err := p.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// kustomizeBuild runs the standalone kustomize on dir and returns stdout,
// stderr and the error.
func kustomizeBuild(ctx context.Context, dir string) ([]byte, string, error) {
	cmd := exec.CommandContext(ctx, binPath("kustomize"), "build", "--enable-alpha-plugins", "--enable-exec", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.String(), err
}

// render renders in and returns the manifests.
func (e env) render(t *testing.T, in instance) []byte {
	t.Helper()
	return e.renderDir(t, e.kustomization(t, "", in))
}

func (e env) renderDir(t *testing.T, dir string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, stderr, err := kustomizeBuild(ctx, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr)
	}
	return out
}

// deployed is a rendered and applied instance.
type deployed struct {
	instance
	objs []*unstructured.Unstructured
}

// deploy applies manifests (server-side, as the admin) and registers the
// clean-up of everything they created.
func (e env) deploy(t *testing.T, in instance, manifests []byte) *deployed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := c.Apply(ctx, manifests, cluster.ApplyOptions{})
	d := &deployed{instance: in, objs: objs}
	t.Cleanup(func() { e.remove(t, d) })
	if err != nil {
		t.Fatalf("apply %s: %v", in.Name, err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	logf(t, "applied %s: %s", in.Name, strings.Join(kinds, " "))
	return d
}

// reapply applies manifests of the same instance again (a list change).
func (e env) reapply(t *testing.T, d *deployed, manifests []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := c.Apply(ctx, manifests, cluster.ApplyOptions{})
	d.objs = append(d.objs, objs...)
	if err != nil {
		t.Fatalf("re-apply %s: %v", d.Name, err)
	}
}

func (e env) deployInstance(t *testing.T, in instance) *deployed {
	t.Helper()
	return e.deploy(t, in, e.render(t, in))
}

func (d *deployed) dsName() string { return "image-prefetcher-" + d.Name }
func (d *deployed) key() string    { return labelDomain + d.Name }

// remove deletes the DaemonSet first and waits for its pods to be gone, so
// that every watch container removes its label with a still valid token,
// then every other object, then strips any key of the instance that is
// left (a scenario that failed half-way), so the next scenario starts
// clean.
func (e env) remove(t *testing.T, d *deployed) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	defer func() { logf(t, "removed instance %s in %.1fs", d.Name, time.Since(start).Seconds()) }()
	err := e.cs.AppsV1().DaemonSets(d.Namespace).Delete(ctx, d.dsName(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean-up: delete DaemonSet %s: %v", d.dsName(), err)
	}
	// Delete the pods directly rather than through the garbage collector,
	// which is slow to catch up after an apiserver outage.
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name}
	if err := e.cs.CoreV1().Pods(d.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean-up: delete pods of %s: %v", d.dsName(), err)
	}
	if err := poll(ctx, "pods of "+d.dsName()+" gone", func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items))
	}); err != nil {
		t.Errorf("clean-up: %v", err)
	}
	for i := len(d.objs) - 1; i >= 0; i-- {
		o := d.objs[i]
		if o.GetKind() == "Namespace" || o.GetKind() == "DaemonSet" {
			continue
		}
		if err := e.deleteObject(ctx, o); err != nil {
			t.Errorf("clean-up: %v", err)
		}
	}
	if !d.SharedNamespace {
		if err := e.cs.CoreV1().Namespaces().Delete(ctx, d.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("clean-up: delete namespace %s: %v", d.Namespace, err)
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, d.key(), d.key())
	for _, n := range c.Nodes() {
		if _, err := e.cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Errorf("clean-up: strip %s from %s: %v", d.key(), n.Name, err)
		}
	}
}

func (e env) deleteObject(ctx context.Context, o *unstructured.Unstructured) error {
	gvr, err := gvrOf(o)
	if err != nil {
		return err
	}
	if o.GetNamespace() != "" {
		err = e.dyn.Resource(gvr).Namespace(o.GetNamespace()).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
	} else {
		err = e.dyn.Resource(gvr).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	return nil
}

// poll calls cond every 500 ms until it returns true or ctx ends; the
// error names what was awaited and the last state seen.
func poll(ctx context.Context, what string, cond func() (bool, string)) error {
	return cluster.Poll(ctx, 500*time.Millisecond, what, cond)
}

// summary is the node annotation's JSON.
type summary struct {
	Total           int       `json:"total"`
	Present         int       `json:"present"`
	Failed          []failure `json:"failed"`
	OmittedFailures int       `json:"omittedFailures"`
	DurationSeconds float64   `json:"durationSeconds"`
	CompletedAt     time.Time `json:"completedAt"`
}

type failure struct {
	Image   string `json:"image"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// nodeState is one node's label value and decoded annotation for an
// instance; label is "" when absent.
type nodeState struct {
	label      string
	annotation string
	summary    summary
}

func (e env) state(ctx context.Context, node, key string) (nodeState, error) {
	n, err := e.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nodeState{}, err
	}
	s := nodeState{label: n.Labels[key], annotation: n.Annotations[key]}
	if s.annotation != "" {
		if err := json.Unmarshal([]byte(s.annotation), &s.summary); err != nil {
			return s, fmt.Errorf("annotation %s on %s is not the summary JSON: %w: %s", key, node, err, s.annotation)
		}
	}
	return s, nil
}

// waitLabel waits until node carries the instance's label with value want
// (and an annotation), and returns the state.
func (e env) waitLabel(t *testing.T, d *deployed, node, want string, timeout time.Duration) nodeState {
	t.Helper()
	return e.waitState(t, d, node, "label "+want, timeout, func(st nodeState) bool {
		return st.label == want && st.annotation != ""
	})
}

// waitState waits until node's state for the instance satisfies ok.
func (e env) waitState(t *testing.T, d *deployed, node, what string, timeout time.Duration, ok func(nodeState) bool) nodeState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var st nodeState
	shown := ""
	start := time.Now()
	err := poll(ctx, fmt.Sprintf("%s: %s on %s", d.key(), what, node), func() (bool, string) {
		var err error
		st, err = e.state(ctx, node, d.key())
		if err != nil {
			return false, err.Error()
		}
		now := fmt.Sprintf("label %q annotation %s", st.label, st.annotation)
		if now != shown {
			shown = now
			logf(t, "%s (%.1fs): %s", node, time.Since(start).Seconds(), now)
		}
		return ok(st), now
	})
	if err != nil {
		e.dumpPods(t, d.Namespace)
		t.Fatal(err)
	}
	return st
}

// waitNoKey waits until node has neither the label nor the annotation key.
func (e env) waitNoKey(t *testing.T, node, key string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := poll(ctx, fmt.Sprintf("%s gone from %s", key, node), func() (bool, string) {
		st, err := e.state(ctx, node, key)
		if err != nil {
			return false, err.Error()
		}
		return st.label == "" && st.annotation == "", fmt.Sprintf("label %q annotation %q", st.label, st.annotation)
	}); err != nil {
		t.Fatal(err)
	}
}

// dumpPods logs the pods of a namespace with their container states, and
// the logs of their containers, to explain a failed wait.
func (e env) dumpPods(t *testing.T, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := e.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods in %s: %v", ns, err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			t.Logf("  %s: restarts %d state %+v", st.Name, st.RestartCount, st.State)
			logs, err := e.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: st.Name}).DoRaw(ctx)
			if err == nil {
				t.Logf("  %s logs:\n%s", st.Name, tailLines(string(logs), 15))
			}
		}
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// waitRolledOut waits until the instance's DaemonSet has observed its
// latest generation and runs an updated, ready pod on want nodes.
func (e env) waitRolledOut(t *testing.T, d *deployed, want int) *appsv1.DaemonSet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ds *appsv1.DaemonSet
	start, shown := time.Now(), ""
	if err := poll(ctx, "DaemonSet "+d.dsName()+" rolled out", func() (bool, string) {
		var err error
		ds, err = e.cs.AppsV1().DaemonSets(d.Namespace).Get(ctx, d.dsName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := ds.Status
		now := fmt.Sprintf("generation %d/%d desired %d updated %d ready %d available %d",
			s.ObservedGeneration, ds.Generation, s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberReady, s.NumberAvailable)
		if now != shown {
			shown = now
			logf(t, "DaemonSet %s (%.1fs): %s", d.dsName(), time.Since(start).Seconds(), now)
		}
		return s.ObservedGeneration == ds.Generation && s.DesiredNumberScheduled == int32(want) &&
			s.UpdatedNumberScheduled == int32(want) && s.NumberReady == int32(want) && s.NumberAvailable == int32(want), now
	}); err != nil {
		e.dumpPods(t, d.Namespace)
		t.Fatal(err)
	}
	return ds
}

// pollPresent asks n's CRI every period until ref is present, and
// returns the time of the first answer that said so.
func pollPresent(ctx context.Context, n *cluster.Node, ref string, period time.Duration) (time.Time, error) {
	cri, err := n.CRI()
	if err != nil {
		return time.Time{}, err
	}
	defer cri.Close()
	for {
		st, err := cri.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err == nil && st.Image != nil {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for %s on %s: %w (last error: %v)", ref, n.Name, ctx.Err(), err)
		case <-time.After(period):
		}
	}
}

// podOn is the name of the instance's pod on node.
func (e env) podOn(t *testing.T, d *deployed, node string) string {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods(d.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + d.Name, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods of %s on %s, want 1", len(pods.Items), d.Name, node)
	}
	return pods.Items[0].Name
}

// logLine waits (up to 30 s) for a line of container's log in pod, written
// at or after since, that contains every one of words, and returns the
// kubelet's timestamp of the line and the line.
func (e env) logLine(t *testing.T, ns, pod, container string, since time.Time, words ...string) (time.Time, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var at time.Time
	var found string
	err := poll(ctx, fmt.Sprintf("a line of %s/%s with %q", pod, container, words), func() (bool, string) {
		raw, err := e.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, Timestamps: true}).DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
	lines:
		for _, l := range strings.Split(string(raw), "\n") {
			stamp, text, ok := strings.Cut(l, " ")
			if !ok {
				continue
			}
			ts, err := time.Parse(time.RFC3339Nano, stamp)
			if err != nil || ts.Before(since) {
				continue
			}
			for _, w := range words {
				if !strings.Contains(text, w) {
					continue lines
				}
			}
			at, found = ts, text
			return true, ""
		}
		return false, tailLines(string(raw), 5)
	})
	if err != nil {
		t.Fatal(err)
	}
	return at, found
}

// assertImages checks through each node's CRI that every ref is present
// (want true) or absent (want false).
func assertImages(t *testing.T, nodes []*cluster.Node, refs []string, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range nodes {
		for _, ref := range refs {
			ok, err := n.HasImage(ctx, ref)
			if err != nil {
				t.Error(err)
				continue
			}
			if ok != want {
				t.Errorf("%s: image %s present = %v through the CRI, want %v", n.Name, ref, ok, want)
			}
		}
	}
}

// testImages pushes one small single-layer image per name, under
// e2e/<name>:v1, and returns the references pods use (ghcr.io/...). Every
// image is random data from a fixed seed, so reruns push the same bytes.
// The clean-up removes them from every node, so the next scenario finds
// cold nodes.
func testImages(t *testing.T, seed int64, size int64, names ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var refs []string
	for i, name := range names {
		img, err := ociimage.Data(seed+int64(i), size)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Push(ctx, img, "e2e/"+name+":v1"); err != nil {
			t.Fatalf("push e2e/%s:v1: %v", name, err)
		}
		refs = append(refs, "ghcr.io/e2e/"+name+":v1")
	}
	forgetImages(t, refs...)
	return refs
}

// forgetImages removes refs from every node when the test ends.
func forgetImages(t *testing.T, refs ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, n := range c.Nodes() {
			for _, ref := range refs {
				if err := n.Remove(ctx, ref); err != nil {
					t.Errorf("clean-up: %v", err)
				}
			}
		}
	})
}

// yamlList indents refs as a YAML list under `images:` in a spec.
func yamlList(refs []string) string {
	var b strings.Builder
	b.WriteString("  images:\n")
	for _, r := range refs {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	return b.String()
}

// events lists the Events of namespace with reason.
func (e env) events(ctx context.Context, ns, reason string) ([]corev1.Event, error) {
	list, err := e.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// waitEvent waits for an Event with reason and type in ns, on a Pod, and
// returns it.
func (e env) waitEvent(t *testing.T, ns, reason, typ string) []corev1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []corev1.Event
	if err := poll(ctx, fmt.Sprintf("%s Event %s in %s", typ, reason, ns), func() (bool, string) {
		evs, err := e.events(ctx, ns, reason)
		if err != nil {
			return false, err.Error()
		}
		got = nil
		for _, ev := range evs {
			if ev.Type == typ && ev.InvolvedObject.Kind == "Pod" {
				got = append(got, ev)
			}
		}
		return len(got) > 0, fmt.Sprintf("%d events", len(evs))
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// podUIDs lists an instance's pods as "name uid restarts", sorted, to show
// that they were left alone.
func (e env) podUIDs(t *testing.T, d *deployed) []string {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods(d.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		restarts := int32(0)
		for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			restarts += st.RestartCount
		}
		out = append(out, fmt.Sprintf("%s %s %d", p.Name, p.UID, restarts))
	}
	sort.Strings(out)
	return out
}

// getObject reads o back from the cluster.
func (e env) getObject(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvr, err := gvrOf(o)
	if err != nil {
		return nil, err
	}
	if o.GetNamespace() != "" {
		return e.dyn.Resource(gvr).Namespace(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
	}
	return e.dyn.Resource(gvr).Get(ctx, o.GetName(), metav1.GetOptions{})
}

func gvrOf(o *unstructured.Unstructured) (schema.GroupVersionResource, error) {
	gvk := o.GroupVersionKind()
	res := map[string]string{
		"ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Secret": "secrets",
		"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
		"ClusterRoleBinding": "clusterrolebindings", "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
		"ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings", "DaemonSet": "daemonsets",
		"Namespace": "namespaces",
	}[gvk.Kind]
	if res == "" {
		return schema.GroupVersionResource{}, fmt.Errorf("no resource known for kind %s", gvk.Kind)
	}
	return schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: res}, nil
}
