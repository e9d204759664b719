package e2e_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// labelWait bounds every wait for a label. It is generous: it covers pod
// start-up on a busy 2-core machine, never a product time bound.
const labelWait = 3 * time.Minute

// Scenario 1: ten images, two of them multi-layer and about 22 MB, end up
// in both nodes' containerd; both nodes are labeled succeeded with the
// right summary, and a Normal Prefetched Event is recorded.
func Test01HappyPath(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	refs := testImages(t, 100, 256<<10, "happy-0", "happy-1", "happy-2", "happy-3", "happy-4", "happy-5", "happy-6", "happy-7")
	for i, name := range []string{"happy-big-a", "happy-big-b"} {
		img, err := ociimage.Data(int64(200+i), 12<<20, 6<<20, 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Push(ctx, img, "e2e/"+name+":v1"); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, "ghcr.io/e2e/"+name+":v1")
		forgetImages(t, "ghcr.io/e2e/"+name+":v1")
	}
	d := e.deployInstance(t, instance{Name: "happy", Namespace: "e2e-happy", Spec: yamlList(refs)})
	for _, n := range c.Nodes() {
		st := e.waitLabel(t, d, n.Name, "succeeded", labelWait)
		s := st.summary
		if s.Total != 10 || s.Present != 10 || len(s.Failed) != 0 || s.OmittedFailures != 0 {
			t.Errorf("%s: summary %s, want total 10, present 10, no failures", n.Name, st.annotation)
		}
		if s.DurationSeconds <= 0 || s.CompletedAt.IsZero() {
			t.Errorf("%s: summary %s lacks durationSeconds or completedAt", n.Name, st.annotation)
		}
	}
	assertImages(t, c.Nodes(), refs, true)
	evs := e.waitEvent(t, d.Namespace, "Prefetched", "Normal")
	if !strings.Contains(evs[0].Message, "10/10") {
		t.Errorf("Prefetched Event message %q does not report 10/10 images", evs[0].Message)
	}
	e.waitRolledOut(t, d, 2)
	// kubectl describe pod lists an Event only when its involvedObject.uid
	// is the pod's: POD_UID comes from the downward API.
	for _, ev := range evs {
		pod, err := e.cs.CoreV1().Pods(d.Namespace).Get(context.Background(), ev.InvolvedObject.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Event %s names pod %s: %v", ev.Name, ev.InvolvedObject.Name, err)
		}
		if ev.InvolvedObject.UID == "" || ev.InvolvedObject.UID != pod.UID {
			t.Errorf("Event %s: involvedObject.uid %q, want the pod's %q (kubectl describe pod would not show it)", ev.Name, ev.InvolvedObject.UID, pod.UID)
		}
	}
}

// Scenario 2: a nodeSelector limits the DaemonSet to one node; the other
// node gets neither the label nor the images.
func Test02NodeSelector(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 300, 128<<10, "selector-a", "selector-b")
	one, other := c.Nodes()[0], c.Nodes()[1]
	pool := one.Labels["e2e.image-prefetcher.io/pool"]
	if pool == "" || pool == other.Labels["e2e.image-prefetcher.io/pool"] {
		t.Fatalf("the nodes need different e2e.image-prefetcher.io/pool labels, got %v and %v", one.Labels, other.Labels)
	}
	spec := yamlList(refs) + fmt.Sprintf("  nodeSelector:\n    e2e.image-prefetcher.io/pool: %s\n", pool)
	d := e.deployInstance(t, instance{Name: "selector", Namespace: "e2e-selector", Spec: spec})
	e.waitLabel(t, d, one.Name, "succeeded", labelWait)
	ds := e.waitRolledOut(t, d, 1)
	if ds.Status.DesiredNumberScheduled != 1 {
		t.Errorf("DaemonSet wants %d pods, want 1", ds.Status.DesiredNumberScheduled)
	}
	assertImages(t, []*cluster.Node{one}, refs, true)
	assertImages(t, []*cluster.Node{other}, refs, false)
	st, err := e.state(context.Background(), other.Name, d.key())
	if err != nil {
		t.Fatal(err)
	}
	if st.label != "" || st.annotation != "" {
		t.Errorf("%s is not selected but has label %q annotation %q", other.Name, st.label, st.annotation)
	}
}

// Scenario 3: a missing image fails fast (permanent NotFound, not the
// overall timeout), the annotation names it, and a Warning Event exists.
func Test03MissingImage(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 400, 128<<10, "missing-present")
	missing := "ghcr.io/e2e/missing-never-pushed:v1"
	spec := yamlList(append(refs, missing)) + "  pull:\n    overallTimeout: 10m\n"
	d := e.deployInstance(t, instance{Name: "missing", Namespace: "e2e-missing", Spec: spec})
	for _, n := range c.Nodes() {
		st := e.waitLabel(t, d, n.Name, "failed", labelWait)
		s := st.summary
		if s.Total != 2 || s.Present != 1 || len(s.Failed) != 1 {
			t.Fatalf("%s: summary %s, want total 2, present 1, one failure", n.Name, st.annotation)
		}
		if f := s.Failed[0]; f.Image != missing || f.Reason != "NotFound" {
			t.Errorf("%s: failure %+v, want image %s reason NotFound", n.Name, f, missing)
		}
		// The product bound is 60 s; the overall timeout is 10 minutes.
		if s.DurationSeconds >= 60 {
			t.Errorf("%s: the run took %.1fs, want under 60 s (a missing image is permanent)", n.Name, s.DurationSeconds)
		}
	}
	assertImages(t, c.Nodes(), refs, true)
	evs := e.waitEvent(t, d.Namespace, "PrefetchFailed", "Warning")
	if !strings.Contains(evs[0].Message, missing) || !strings.Contains(evs[0].Message, "NotFound") {
		t.Errorf("PrefetchFailed Event message %q does not name %s and NotFound", evs[0].Message, missing)
	}
}

// Scenario 4: a private repository answers 401 without credentials
// (failed, Unauthorized); with a kubernetes.io/dockerconfigjson pull secret
// in imagePullSecrets, the same image is pulled (succeeded).
func Test04PullSecret(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 500, 128<<10, "private-app")
	reg := c.Registry()
	reg.RequireAuth("e2e/private-*", "puller", "s3cret")
	t.Cleanup(reg.ClearFaults)

	in := instance{Name: "private", Namespace: "e2e-private", Spec: yamlList(refs)}
	d := e.deployInstance(t, in)
	for _, n := range c.Nodes() {
		st := e.waitLabel(t, d, n.Name, "failed", labelWait)
		if len(st.summary.Failed) != 1 || st.summary.Failed[0].Reason != "Unauthorized" || st.summary.Failed[0].Image != refs[0] {
			t.Errorf("%s: summary %s, want %s failed as Unauthorized", n.Name, st.annotation, refs[0])
		}
	}
	assertImages(t, c.Nodes(), refs, false)

	auth := base64.StdEncoding.EncodeToString([]byte("puller:s3cret"))
	cfg := fmt.Sprintf(`{"auths":{"ghcr.io":{"auth":%q}}}`, auth)
	in.Resources = map[string]string{"secret.yaml": fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: regcred
  namespace: %s
type: kubernetes.io/dockerconfigjson
data:
  .dockerconfigjson: %s
`, in.Namespace, base64.StdEncoding.EncodeToString([]byte(cfg)))}
	in.Spec += "  imagePullSecrets:\n  - regcred\n"
	logf(t, "adding the pull secret and re-applying")
	e.reapply(t, d, e.render(t, in))
	for _, n := range c.Nodes() {
		st := e.waitLabel(t, d, n.Name, "succeeded", labelWait)
		if st.summary.Present != 1 || len(st.summary.Failed) != 0 {
			t.Errorf("%s: summary %s, want the private image present", n.Name, st.annotation)
		}
	}
	assertImages(t, c.Nodes(), refs, true)
	var ok401 bool
	for _, r := range reg.Requests(registry.Match{Repo: "e2e/private-app", Kind: registry.Manifests}) {
		ok401 = ok401 || r.Status == 401
	}
	if !ok401 {
		t.Error("the registry never answered 401 for the private image")
	}
}

// Scenario 5: a flaky registry (503 three times per manifest) and a
// stalled blob both end in succeeded.
func Test05FlakyRegistry(t *testing.T) {
	e := setup(t)
	reg := c.Registry()
	t.Run("503", func(t *testing.T) {
		refs := testImages(t, 600, 128<<10, "flaky-a", "flaky-b")
		// Only the pulls count, not the pushes before them.
		pushed := map[string]int{}
		for _, repo := range []string{"e2e/flaky-a", "e2e/flaky-b"} {
			pushed[repo] = len(reg.Requests(registry.Match{Repo: repo, Kind: registry.Manifests}))
		}
		reg.Fail(registry.Match{Repo: "e2e/flaky-*", Kind: registry.Manifests}, 503, 3)
		t.Cleanup(reg.ClearFaults)
		d := e.deployInstance(t, instance{Name: "flaky", Namespace: "e2e-flaky", Spec: yamlList(refs)})
		for _, n := range c.Nodes() {
			st := e.waitLabel(t, d, n.Name, "succeeded", labelWait)
			if st.summary.Present != 2 {
				t.Errorf("%s: summary %s, want 2 present", n.Name, st.annotation)
			}
		}
		assertImages(t, c.Nodes(), refs, true)
		for _, repo := range []string{"e2e/flaky-a", "e2e/flaky-b"} {
			var statuses []int
			for _, r := range reg.Requests(registry.Match{Repo: repo, Kind: registry.Manifests})[pushed[repo]:] {
				statuses = append(statuses, r.Status)
			}
			if len(statuses) < 4 || fmt.Sprint(statuses[:3]) != "[503 503 503]" || statuses[3] == 503 {
				t.Errorf("%s manifest requests answered %v, want 503 three times, then success", repo, statuses)
			}
		}
	})
	t.Run("stall", func(t *testing.T) {
		img, err := ociimage.Data(700, 2<<20)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := c.Push(ctx, img, "e2e/stall:v1"); err != nil {
			t.Fatal(err)
		}
		ref := "ghcr.io/e2e/stall:v1"
		forgetImages(t, ref)
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		digest, err := layers[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		// The first GET of the blob hangs until the client gives up: the
		// first 3 s attempt times out, the next (6 s) gets the blob.
		reg.Stall(registry.Match{Repo: "e2e/stall", Ref: digest.String()}, 1, 0)
		t.Cleanup(reg.ClearFaults)
		spec := yamlList([]string{ref}) + "  pull:\n    initialAttemptTimeout: 3s\n    maxAttemptTimeout: 1m\n"
		d := e.deployInstance(t, instance{Name: "stall", Namespace: "e2e-stall", Spec: spec})
		slowest := 0.0
		for _, n := range c.Nodes() {
			st := e.waitLabel(t, d, n.Name, "succeeded", labelWait)
			slowest = max(slowest, st.summary.DurationSeconds)
		}
		assertImages(t, c.Nodes(), []string{ref}, true)
		gets := 0
		for _, r := range reg.Requests(registry.Match{Repo: "e2e/stall", Ref: digest.String(), Method: "GET"}) {
			if strings.Contains(r.Path, "/blobs/") {
				gets++
			}
		}
		// One stalled GET, its retry, and the other node's GET.
		if gets < 3 {
			t.Errorf("the registry saw %d GETs of the stalled blob, want at least 3 (stalled, retried, other node)", gets)
		}
		if slowest < 3 {
			t.Errorf("no node's run lasted the stalled 3 s attempt (slowest %.1fs): the stall was not hit", slowest)
		}
	})
}

// podsOf lists the pods of an instance.
func (e env) podsOf(t *testing.T, d *deployed) []string {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods(d.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	return names
}
