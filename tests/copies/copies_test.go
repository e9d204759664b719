// Package copies_test applies one rendering twice, under two kustomize
// namePrefixes, as two Argo CD applications or two overlays would: one
// instance, two DaemonSets, one node key. The real kustomize and function
// render it, a real kube-apiserver admits it, and a real kubelet runs both
// agents on one node.
//
// Run: go test -p 1 -v ./tests/copies/ (after `make build tools`).
package copies_test

import (
	"context"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

var c *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, cluster.Options{Deploys: true, Nodes: 1}, &c))
}

const (
	ns  = "copies"
	dsA = "a-image-prefetcher-web"
	dsB = "b-image-prefetcher-web"
)

var key = v1alpha1.NodeKey("web")

// TestCopiesOfOneRendering: copy a (namePrefix a-) lists one image, copy b
// (namePrefix b-) two. a is applied first and writes the key; then b. b's
// agent finds the key owned by DaemonSet a-image-prefetcher-web, leaves it
// alone and says so (InstanceConflict), at every run of its fetch: over
// two of them, and a's refreshes every 2 s, the key never names b. A label
// patch with a token bound to b's real pod is denied by the policy. Once
// a is deleted, its agent removes the key on its way out and b's takes it.
func TestCopiesOfOneRendering(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	node := c.Nodes()[0].Name
	for i, repo := range []string{"copies/app:v1", "copies/extra:v1"} {
		if err := c.PushPause(ctx, repo, fmt.Sprintf("%d:%d", 65532-i, 65532-i)); err != nil {
			t.Fatal(err)
		}
	}
	agentRef, _, err := c.PushProjectImages(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	a, b := render(ctx, t, agentRef)
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uninstall(t, cs) })

	if _, err := c.Apply(ctx, a, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply copy a: %v", err)
	}
	written, err := c.WaitNode(ctx, node, func(n *corev1.Node) bool {
		return n.Labels[key] == v1alpha1.LabelSucceeded && ownedBy(n, dsA)
	})
	if err != nil {
		c.DumpLogs(t)
		t.Fatalf("copy a's key: %v", err)
	}

	// From here on every change of the node is seen: the key must stay a's.
	var mu sync.Mutex
	var flip string
	stop, err := c.WatchNode(ctx, node, written.ResourceVersion, func(n *corev1.Node) {
		mu.Lock()
		defer mu.Unlock()
		if flip == "" && (n.Labels[key] != v1alpha1.LabelSucceeded || !ownedBy(n, dsA)) {
			flip = fmt.Sprintf("%q %s", n.Labels[key], n.Annotations[key])
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, b, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply copy b: %v", err)
	}
	evs := waitConflicts(ctx, t, cs, 2)
	for _, want := range []string{"DaemonSet " + dsA + ", another copy of this instance copies/web", "(this is DaemonSet " + dsB + ")"} {
		if !strings.Contains(evs[0].Message, want) {
			t.Errorf("InstanceConflict %q does not say %q", evs[0].Message, want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if flip != "" {
		t.Fatalf("the key left copy a while b ran: %s", flip)
	}

	// b's own token, bound to its real pod, may not take or remove the key.
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, evs[0].InvolvedObject.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentB, err := c.PodClient(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	ann := fmt.Sprintf(`{"owner":{"namespace":%q,"name":"web","daemonSet":%q,"id":"x"},"total":2,"present":2,"failed":[]}`, ns, dsB)
	for name, patch := range map[string]string{
		"write":  fmt.Sprintf(`{"metadata":{"labels":{%q:"failed"},"annotations":{%q:%q}}}`, key, key, ann),
		"remove": fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, key, key),
	} {
		_, err := agentB.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "or to another copy (DaemonSet) of this one") {
			t.Errorf("copy b's agent token, %s: %v, want a denial by the policy for another copy's key", name, err)
		}
	}

	// Copy a goes (a prefix changed, an application deleted): its agent
	// removes the key, and b's next fetch takes it. Deleting b's pod
	// starts that fetch now instead of after the kubelet's back-off.
	bg := metav1.DeletePropagationBackground
	if err := cs.AppsV1().DaemonSets(ns).Delete(ctx, dsA, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitNode(ctx, node, func(n *corev1.Node) bool { _, has := n.Annotations[key]; return !has }); err != nil {
		t.Fatalf("copy a's key after its DaemonSet went: %v", err)
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitNode(ctx, node, func(n *corev1.Node) bool {
		return n.Labels[key] == v1alpha1.LabelSucceeded && ownedBy(n, dsB) && strings.Contains(n.Annotations[key], `"total":2,`)
	}); err != nil {
		c.DumpLogs(t)
		t.Fatalf("copy b's key once a is gone: %v", err)
	}
}

// render builds one rendering (the function in a base kustomization) under
// namePrefix a- and b-. b's overlay lists a second image in the list
// ConfigMap, so the two copies differ as the did.
func render(ctx context.Context, t *testing.T, agentRef string) (a, b []byte) {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"base/kustomization.yaml": "generators:\n- prefetcher.yaml\n",
		"base/prefetcher.yaml": fmt.Sprintf(`apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: web
  namespace: %s
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: %s
spec:
  agent:
    image: %s
  images:
  - ghcr.io/copies/app:v1
  refreshInterval: 1m
`, ns, cluster.BinPath("image-prefetcher-fn"), agentRef),
		"a/kustomization.yaml": "namePrefix: a-\nresources:\n- ../base\n",
		"b/kustomization.yaml": `namePrefix: b-
resources:
- ../base
patches:
- target:
    kind: ConfigMap
  patch: |
    - op: replace
      path: /data/images.txt
      value: "ghcr.io/copies/app:v1\nghcr.io/copies/extra:v1\n"
`,
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out [2][]byte
	for i, dir := range []string{"a", "b"} {
		m, err := cluster.Kustomize(ctx, filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		// watch checks every 2 s instead of every minute.
		if out[i], err = cluster.ShortenRefresh(m, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return out[0], out[1]
}

// ownedBy: the key's annotation names the copy whose DaemonSet is ds.
func ownedBy(n *corev1.Node, ds string) bool {
	return strings.HasPrefix(n.Annotations[key], v1alpha1.Instance{Namespace: ns, Name: "web"}.CopyPrefix(ds))
}

// waitConflicts waits, on a watch of the namespace's Events, for want
// InstanceConflict Events of copy b's pods (one per run of its fetch) and
// returns them.
func waitConflicts(ctx context.Context, t *testing.T, cs *kubernetes.Clientset, want int) []corev1.Event {
	t.Helper()
	sel := fields.OneTermEqualSelector("reason", "InstanceConflict").String()
	list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Events(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var got []corev1.Event
	add := func(e corev1.Event) {
		if e.InvolvedObject.Kind == "Pod" && strings.HasPrefix(e.InvolvedObject.Name, dsB+"-") && e.Type == corev1.EventTypeWarning {
			got = append(got, e)
		}
	}
	for _, e := range list.Items {
		add(e)
	}
	for len(got) < want {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch of Events ended with %d InstanceConflict Events of copy b, want %d", len(got), want)
			}
			if e, isEvent := ev.Object.(*corev1.Event); isEvent && ev.Type == watch.Added {
				add(*e)
			}
		case <-ctx.Done():
			c.DumpLogs(t)
			t.Fatalf("%d InstanceConflict Events of copy b, want %d: %v", len(got), want, ctx.Err())
		}
	}
	return got
}

// uninstall deletes both DaemonSets and waits for their pods to go, so
// that every agent settles the key with a valid token before teardown.
func uninstall(t *testing.T, cs *kubernetes.Clientset) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bg := metav1.DeletePropagationBackground
	for _, ds := range []string{dsA, dsB} {
		if err := cs.AppsV1().DaemonSets(ns).Delete(ctx, ds, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("clean-up: delete DaemonSet %s: %v", ds, err)
		}
	}
	if err := cluster.Poll(ctx, 250*time.Millisecond, "the agent pods gone", func() (bool, string) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items))
	}); err != nil {
		t.Errorf("clean-up: %v", err)
	}
}
