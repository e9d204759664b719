package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Scenario 16: an upgrade from one release to the next, as a platform team
// runs it. There is no earlier tagged release (VERSION never changed), so
// both come from this tree: release A at VERSION (Test15's, when it ran)
// and release B at the next patch version, whose agent and function
// images have other digests (the version is stamped into both binaries).
// A's quickstart.yaml is applied with the cluster's kubectl and every node
// ends succeeded; B's is applied over it the same way. A watch on the
// Nodes, open from before B's apply until every node's summary was
// written by a pod of B, sees the label never leave succeeded (pods select
// nodes by it). The old pods are gone and every agent container runs B's
// digest; the annotation, its owner and the pins are as before, and no
// listed image (nor A's agent) is fetched from the registry again. A and
// B render the same objects, so an apply, which prunes nothing, leaves
// nothing of A behind. The uninstall of docs/install.md then leaves no
// key on any node.
func Test16ReleaseUpgrade(t *testing.T) {
	e := setup(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	next, err := nextPatch(version.Version)
	if err != nil {
		t.Fatal(err)
	}
	a := releaseOf(t, version.Version)
	b := releaseOf(t, next)
	if a.agent.DigestStr() == b.agent.DigestStr() {
		t.Fatalf("releases %s and %s pushed the same agent digest %s: the upgrade would change nothing",
			a.version, b.version, a.agent.DigestStr())
	}
	objsA, err := demo.Decode(a.quickstart)
	if err != nil {
		t.Fatal(err)
	}
	objsB, err := demo.Decode(b.quickstart)
	if err != nil {
		t.Fatal(err)
	}
	// `kubectl apply` prunes nothing: an object A renders and B does not
	// would stay behind.
	if sa, sb := objectSet(objsA), objectSet(objsB); !slices.Equal(sa, sb) {
		t.Errorf("releases %s and %s render other objects:\n%s:\n  %s\n%s:\n  %s", a.version, b.version,
			a.version, strings.Join(sa, "\n  "), b.version, strings.Join(sb, "\n  "))
	}
	inst, ns, images, err := demo.Describe(objsB)
	if err != nil {
		t.Fatal(err)
	}
	// B changes the agent's image, nothing else.
	ds := "DaemonSet " + ns + "/image-prefetcher-" + inst
	if changed := changedObjects(objsA, objsB); !slices.Equal(changed, []string{ds}) {
		t.Errorf("%s renders these objects unlike %s: %q, want %s alone", b.version, a.version, changed, ds)
	}
	standIns, err := demo.PushStandIns(ctx, c, images, b.agentRef)
	if err != nil {
		t.Fatal(err)
	}
	forgetImages(t, standIns...)
	// A test before may have used the namespace: its deletion must be
	// over before anything is created in it.
	e.waitNamespaceGone(ctx, t, ns)
	d := &deployed{instance: instance{Name: inst, Namespace: ns}, objs: objsB}
	// A safety net for a test that fails half-way; after the uninstall
	// below it finds nothing left.
	t.Cleanup(func() { e.remove(t, d) })
	dir := t.TempDir()

	// The nodes fetch the stand-ins when A is installed (forgetImages took
	// them off): the registry's log counts them, so that the zero counted
	// during the upgrade means nothing was fetched.
	reg := c.Registry()
	fetches := func(repo string) int {
		return len(reg.Requests(registry.Match{Repo: repo, Kind: registry.Blobs, Method: "GET"}))
	}
	installFetches := map[string]int{}
	for _, repo := range repositories(t, standIns) {
		installFetches[repo] = fetches(repo)
	}
	phase := time.Now()
	kubectlApply(ctx, t, writeFile(t, filepath.Join(dir, a.version, "quickstart.yaml"), a.quickstart))
	for _, n := range c.Nodes() {
		e.waitLabel(t, d, n.Name, "succeeded", labelWait)
	}
	e.waitRolledOut(t, d, len(c.Nodes()))
	logf(t, "release %s installed in %.1fs", a.version, time.Since(phase).Seconds())
	oldPods := e.podsOf(t, d)
	versions := e.resourceVersions(ctx, t, objsA)
	before := e.nodeSummaries(ctx, t, d.key())
	pinsBefore := pinMarks(ctx, t, images, pin.MarkKey(ns, inst))
	for repo, n := range installFetches {
		if fetches(repo) == n {
			t.Errorf("installing %s fetched no blob of %s: the registry's log does not see the nodes' pulls", a.version, repo)
		}
	}
	watched := append(repositories(t, images), b.agent.Context().RepositoryStr())
	seen := map[string]int{}
	for _, repo := range watched {
		seen[repo] = len(reg.Requests(registry.Match{Repo: repo}))
	}

	phase = time.Now()
	w := e.watchLabel(t, d.key())
	kubectlApply(ctx, t, writeFile(t, filepath.Join(dir, b.version, "quickstart.yaml"), b.quickstart))
	e.waitUpgraded(ctx, t, d, oldPods, b.agent)
	events, violations := w.finish()
	logf(t, "upgraded to %s in %.1fs; the Node watch saw %d changes", b.version, time.Since(phase).Seconds(), events)
	for _, v := range violations {
		t.Errorf("the label left succeeded, or the annotation went, during the upgrade: %s", v)
	}
	if events == 0 {
		t.Error("the Node watch saw no change at all: it did not watch the upgrade")
	}

	// The apply wrote the DaemonSet alone (kubectl may say "configured" of
	// an object whose patch changed nothing once defaulted).
	for obj, rv := range e.resourceVersions(ctx, t, objsA) {
		if rv != versions[obj] && obj != ds {
			t.Errorf("%s changed (resourceVersion %s, was %s): %s renders it as %s did", obj, rv, versions[obj],
				b.version, a.version)
		}
	}
	after := e.nodeSummaries(ctx, t, d.key())
	for _, n := range c.Nodes() {
		was, now := before[n.Name], after[n.Name]
		if now.Present != len(images) || now.Total != len(images) || len(now.Failed) != 0 {
			t.Errorf("%s after the upgrade: %d/%d present, failed %v; want %d/%d", n.Name,
				now.Present, now.Total, now.Failed, len(images), len(images))
		}
		if !reflect.DeepEqual(was.Owner, now.Owner) {
			t.Errorf("%s: the key's owner was %+v, is %+v after the upgrade", n.Name, was.Owner, now.Owner)
		}
		// The e2e nodes run containerd 1.6.20, which cannot pin: both
		// summaries say so. On a runtime that pins, the same count.
		if !reflect.DeepEqual(was.Pins, now.Pins) {
			t.Errorf("%s: pins were %+v, are %+v after the upgrade", n.Name, was.Pins, now.Pins)
		}
	}
	if pinsAfter := pinMarks(ctx, t, images, pin.MarkKey(ns, inst)); !reflect.DeepEqual(pinsBefore, pinsAfter) {
		t.Errorf("the instance's pin marks were %v, are %v after the upgrade", pinsBefore, pinsAfter)
	}
	e.assertNothingFetchedAgain(t, watched, seen, a.agent, b.agent)

	phase = time.Now()
	e.uninstallAsDocumented(ctx, t, d, filepath.Join(dir, b.version, "quickstart.yaml"))
	logf(t, "uninstalled in %.1fs; the whole test took %.1fs", time.Since(phase).Seconds(), time.Since(start).Seconds())
}

// nextPatch is version with its last number one higher: 0.1.0 -> 0.1.1.
func nextPatch(v string) (string, error) {
	i := strings.LastIndex(v, ".")
	n, err := strconv.Atoi(v[i+1:])
	if i < 0 || err != nil {
		return "", fmt.Errorf("version %q does not end in .<number>", v)
	}
	return v[:i+1] + strconv.Itoa(n+1), nil
}

// objectSet is "Kind namespace/name" of every object, sorted.
func objectSet(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(out)
	return out
}

// changedObjects is "Kind namespace/name" of every object of a that b
// renders otherwise, sorted.
func changedObjects(a, b []*unstructured.Unstructured) []string {
	in := map[string]*unstructured.Unstructured{}
	for _, o := range b {
		in[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = o
	}
	var out []string
	for _, o := range a {
		key := o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		if other, ok := in[key]; ok && !reflect.DeepEqual(o.Object, other.Object) {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// resourceVersions reads the resourceVersion of every object of objs from
// the cluster, by "Kind namespace/name".
func (e env) resourceVersions(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objs {
		live, err := e.getObject(ctx, o)
		if err != nil {
			t.Fatalf("read %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		out[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = live.GetResourceVersion()
	}
	return out
}

func writeFile(t *testing.T, file string, content []byte) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// kubectlApply runs `kubectl apply -f file` with the cluster's kubectl, as
// docs/install.md tells users to.
func kubectlApply(ctx context.Context, t *testing.T, file string) {
	t.Helper()
	kubectl(ctx, t, "apply", "-f", file)
}

func kubectl(ctx context.Context, t *testing.T, args ...string) {
	t.Helper()
	var out bytes.Buffer
	cmd := c.Command(ctx, "kubectl", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	logf(t, "kubectl %s:\n%s", strings.Join(args, " "), strings.TrimSpace(out.String()))
}

// waitNamespaceGone waits until namespace ns does not exist.
func (e env) waitNamespaceGone(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := poll(wctx, "namespace "+ns+" gone", func() (bool, string) {
		got, err := e.cs.CoreV1().Namespaces().Get(wctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, "phase " + string(got.Status.Phase)
	}); err != nil {
		t.Fatal(err)
	}
}

// nodeSummaries reads every node's annotation for key; a node without the
// label succeeded fails the test.
func (e env) nodeSummaries(ctx context.Context, t *testing.T, key string) map[string]label.Summary {
	t.Helper()
	out := map[string]label.Summary{}
	for _, n := range c.Nodes() {
		node, err := e.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v := node.Labels[key]; v != "succeeded" {
			t.Fatalf("%s: label %s=%q, want succeeded", n.Name, key, v)
		}
		var s label.Summary
		if err := json.Unmarshal([]byte(node.Annotations[key]), &s); err != nil {
			t.Fatalf("%s: annotation %s: %v: %q", n.Name, key, err, node.Annotations[key])
		}
		out[n.Name] = s
	}
	return out
}

// pinMarks is, per node, the listed images that carry the instance's pin
// mark in containerd.
func pinMarks(ctx context.Context, t *testing.T, images []string, mark string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, n := range c.Nodes() {
		for _, ref := range images {
			l, err := n.ImageLabels(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if l[mark] != "" && l[pin.PinLabel] == pin.PinValue {
				out[n.Name] = append(out[n.Name], ref)
			}
		}
	}
	return out
}

// repositories are the registry repositories of images.
func repositories(t *testing.T, images []string) []string {
	t.Helper()
	var out []string
	for _, img := range images {
		ref, err := name.ParseReference(img)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ref.Context().RepositoryStr())
	}
	return out
}

// waitUpgraded waits until the DaemonSet has rolled to new pods on every
// node, all ready, all of whose containers run agent's digest, and every
// node's summary was written by the new pod on it.
func (e env) waitUpgraded(ctx context.Context, t *testing.T, d *deployed, oldPods []string, agent name.Digest) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	what := "every node runs a ready agent of " + agent.DigestStr() + " that wrote its summary"
	err := poll(wctx, what, func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(d.Namespace).List(wctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/instance=" + d.Name})
		if err != nil {
			return false, err.Error()
		}
		var waiting []string
		onNode := map[string]string{}
		for _, p := range pods.Items {
			if why := upgradedPod(p, oldPods, agent); why != "" {
				waiting = append(waiting, p.Name+" "+why)
				continue
			}
			onNode[p.Spec.NodeName] = string(p.UID)
		}
		for _, n := range c.Nodes() {
			uid, ok := onNode[n.Name]
			if !ok {
				waiting = append(waiting, n.Name+": no upgraded pod")
				continue
			}
			st, err := e.state(wctx, n.Name, d.key())
			if err != nil {
				return false, err.Error()
			}
			var s label.Summary
			if err := json.Unmarshal([]byte(st.annotation), &s); err != nil || s.Pod != uid {
				waiting = append(waiting, fmt.Sprintf("%s: summary of pod %q, not yet of %s", n.Name, s.Pod, uid))
			}
		}
		return len(waiting) == 0 && len(pods.Items) == len(c.Nodes()), strings.Join(waiting, "; ")
	})
	if err != nil {
		e.dumpPods(t, d.Namespace)
		t.Fatal(err)
	}
}

// upgradedPod says why p is not yet a ready pod of agent that replaced one
// of oldPods; "" when it is.
func upgradedPod(p corev1.Pod, oldPods []string, agent name.Digest) string {
	if slices.Contains(oldPods, p.Name) {
		return "is an old pod"
	}
	for _, ct := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if !strings.HasSuffix(ct.Image, "@"+agent.DigestStr()) {
			return fmt.Sprintf("container %s runs %s", ct.Name, ct.Image)
		}
	}
	statuses := append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
	if len(statuses) != len(p.Spec.InitContainers)+len(p.Spec.Containers) {
		return "not every container has started"
	}
	for _, st := range statuses {
		if !strings.HasSuffix(st.ImageID, "@"+agent.DigestStr()) {
			return fmt.Sprintf("container %s runs image %q", st.Name, st.ImageID)
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return ""
		}
	}
	return "not ready"
}

// assertNothingFetchedAgain checks the registry's log since seen was
// counted: no request for a listed image's repository (every node has
// them) and, in the agent's repository, none for the old release's index
// and no blob of the new one fetched more than once per node.
func (e env) assertNothingFetchedAgain(t *testing.T, repos []string, seen map[string]int, old, upgraded name.Digest) {
	t.Helper()
	reg := c.Registry()
	agentRepo := upgraded.Context().RepositoryStr()
	for _, repo := range repos {
		reqs := reg.Requests(registry.Match{Repo: repo})[seen[repo]:]
		if repo != agentRepo {
			for _, r := range reqs {
				t.Errorf("the upgrade fetched %s again: %s %s (status %d, %d bytes)", repo, r.Method, r.Path, r.Status, r.Bytes)
			}
			continue
		}
		blobs := map[string]int{}
		for _, r := range reqs {
			if strings.HasSuffix(r.Path, "/manifests/"+old.DigestStr()) {
				t.Errorf("the upgrade fetched the old agent index again: %s %s", r.Method, r.Path)
			}
			if r.Method == "GET" && strings.Contains(r.Path, "/blobs/") {
				blobs[r.Path]++
			}
		}
		logf(t, "the upgrade sent %d requests for %s: %d blobs fetched", len(reqs), repo, len(blobs))
		for blob, n := range blobs {
			if n > len(c.Nodes()) {
				t.Errorf("%s fetched %d times by %d nodes", blob, n, len(c.Nodes()))
			}
		}
	}
}

// uninstallAsDocumented runs the uninstall of docs/install.md. Deleting
// the DaemonSet in the foreground returns once its pods are gone, so each
// agent has removed its node's key by then; the rest goes next, and
// `status --cleanup` finds nothing left.
func (e env) uninstallAsDocumented(ctx context.Context, t *testing.T, d *deployed, file string) {
	t.Helper()
	kubectl(ctx, t, "-n", d.Namespace, "delete", "daemonset", d.dsName(), "--cascade=foreground")
	if pods := e.podsOf(t, d); len(pods) != 0 {
		t.Errorf("pods %v still there once the DaemonSet's deletion returned", pods)
	}
	for _, n := range c.Nodes() {
		if st, err := e.state(ctx, n.Name, d.key()); err != nil || st.label != "" || st.annotation != "" {
			t.Errorf("%s: label %q annotation %q (%v) once the DaemonSet's deletion returned, want neither",
				n.Name, st.label, st.annotation, err)
		}
	}
	kubectl(ctx, t, "delete", "-f", file, "--ignore-not-found")
	out, code := runStatus(t, ctx, "--cleanup", d.Name, "--namespace", d.Namespace)
	if code != 0 {
		t.Errorf("status --cleanup exited %d:\n%s", code, out)
	}
	logf(t, "status --cleanup:\n%s", strings.TrimSpace(out))
	// kubectl delete waited for the namespace: a test after this one may
	// create it again.
	e.waitNamespaceGone(ctx, t, d.Namespace)
}
