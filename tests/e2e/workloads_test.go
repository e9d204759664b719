package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// The app of the staged-rollout scenario: three workload kinds whose
// images the ImagePrefetcher reads from the same render (no image list).
// The release's tag is set by the kustomization's images: override, which
// kustomize applies before the function runs.
const (
	shopNamespace     = "e2e-shop"
	shopPrefetcher    = "shop"
	shopPrefetcherNS  = "e2e-shop-prefetch"
	shopAppReplicas   = 2
	shopStatefulPods  = 1
	partOfLabel       = "app.kubernetes.io/part-of"
	partOfPrefetcher  = "image-prefetcher"
	alreadyPresentMsg = "already present on machine"
)

// shopRepos are the app's repositories; each release pushes a runnable
// stand-in under every one of them with the release's tag.
var shopRepos = []string{"e2e/shop-web", "e2e/shop-cache", "e2e/shop-node"}

var shopFiles = map[string]string{
	"prefetch-namespace.yaml": fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %s
  labels:
    # The first stage applies what is part of the image prefetcher: the
    # function's objects carry this label, and so does their namespace.
    %s: %s
    pod-security.kubernetes.io/enforce: privileged
`, shopPrefetcherNS, partOfLabel, partOfPrefetcher),
	"app.yaml": fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: %[1]s
spec:
  replicas: %[2]d
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: ghcr.io/e2e/shop-web:written-in-the-file
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: cache
  namespace: %[1]s
spec:
  serviceName: cache
  replicas: %[3]d
  selector:
    matchLabels: {app: cache}
  template:
    metadata:
      labels: {app: cache}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: cache
        image: ghcr.io/e2e/shop-cache:written-in-the-file
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: node
  namespace: %[1]s
spec:
  selector:
    matchLabels: {app: node}
  template:
    metadata:
      labels: {app: node}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: node
        image: ghcr.io/e2e/shop-node:written-in-the-file
`, shopNamespace, shopAppReplicas, shopStatefulPods),
}

// TestWorkloadsStagedRollout is the staged rollout of
// docs/staged-rollouts.md on the real cluster, twice: release v1 on cold
// nodes, then release v2 replacing it. Each release is one kustomize render
// of the app and an ImagePrefetcher that selects the app's namespace; it is
// applied in two stages, as an Argo CD sync wave or a Flux dependsOn would:
//
//  1. the prefetcher's objects, then wait for its DaemonSet's rollout,
//     which completes only once every node holds the release's images;
//  2. the workloads.
//
// Every pod of the release then starts without one blob request to the
// registry for its image, and its kubelet events say the image was already
// present on the machine. A third release names a tag that does not exist:
// its prefetcher rollout holds (spec.rollout.requireAllImages), so the
// workloads' stage would never start.
func TestWorkloadsStagedRollout(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reg := c.Registry()

	dir := t.TempDir()
	for name, content := range shopFiles {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prefetcher := &deployed{instance: instance{Name: shopPrefetcher, Namespace: shopPrefetcherNS}}
	var refs []string
	t.Cleanup(func() { forgetRefs(t, refs) })
	t.Cleanup(func() { e.remove(t, prefetcher) })
	t.Cleanup(func() { e.deleteNamespace(t, shopNamespace) })

	for i, release := range []string{"v1", "v2"} {
		logf(t, "release %s", release)
		var releaseRefs []string
		for j, repo := range shopRepos {
			ref := "ghcr.io/" + repo + ":" + release
			img, err := demo.StandIn(ctx, ref, int64(100*i+j))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Push(ctx, img, repo+":"+release); err != nil {
				t.Fatalf("push %s: %v", ref, err)
			}
			releaseRefs = append(releaseRefs, ref)
		}
		refs = append(refs, releaseRefs...)
		writeShopKustomization(t, dir, e.agentRef, release)
		prefetch, app := splitStages(t, e.renderDir(t, dir))

		// The list comes from the workloads, after the images: override.
		assertRenderedList(t, prefetch, releaseRefs)

		// Stage 1: the prefetcher. Its DaemonSet rolls out (a new list is a
		// new pod template) only when each pod's fetch init container has
		// pulled the whole list on its node.
		start := blobRequests(reg)
		objs, err := c.Apply(ctx, prefetch, cluster.ApplyOptions{})
		prefetcher.objs = append(prefetcher.objs, objs...)
		if err != nil {
			t.Fatalf("apply the prefetcher of %s: %v", release, err)
		}
		e.waitRolledOut(t, prefetcher, len(c.Nodes()))
		assertImages(t, c.Nodes(), releaseRefs, true)

		// Stage 2: the workloads of the same render.
		before := blobRequests(reg)
		for _, repo := range shopRepos {
			// The agents fetched the blobs (the counter sees them).
			if before[repo] == start[repo] {
				t.Errorf("release %s: no blob request for %s while the prefetcher rolled out", release, repo)
			}
		}
		if _, err := c.Apply(ctx, app, cluster.ApplyOptions{}); err != nil {
			t.Fatalf("apply the workloads of %s: %v", release, err)
		}
		pods := e.waitReleasePods(t, ctx, release, shopAppReplicas+shopStatefulPods+len(c.Nodes()))
		after := blobRequests(reg)
		for _, repo := range shopRepos {
			if n := after[repo] - before[repo]; n != 0 {
				t.Errorf("release %s: %d blob requests for %s while its workloads started, want 0", release, n, repo)
			}
		}
		e.assertAlreadyPresent(t, ctx, pods)
		logf(t, "release %s: %d pods started, 0 blob requests, every image already present", release, len(pods))
	}

	// Release v3 names a tag nobody pushed. With requireAllImages the
	// prefetcher's new pod cannot become ready: fetch labels its node
	// failed, names the image, and exits with an error, so the rollout
	// that the workloads' stage waits for does not complete, and the
	// workloads keep running v2.
	writeShopKustomization(t, dir, e.agentRef, "v3")
	prefetch, _ := splitStages(t, e.renderDir(t, dir))
	objs, err := c.Apply(ctx, prefetch, cluster.ApplyOptions{})
	prefetcher.objs = append(prefetcher.objs, objs...)
	if err != nil {
		t.Fatalf("apply the prefetcher of v3: %v", err)
	}
	e.waitGateHolds(t, ctx, prefetcher, "ghcr.io/e2e/shop-web:v3")
}

// waitGateHolds waits until a pod of the prefetcher's new revision has
// had its fetch init container exit with code 3 (an image failed), its node
// labelled failed with missing among the failures, and checks that the
// DaemonSet is then not rolled out.
func (e env) waitGateHolds(t *testing.T, ctx context.Context, d *deployed, missing string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var node string
	if err := poll(ctx, "a fetch init container of "+d.dsName()+" exiting with code 3", func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			for _, st := range p.Status.InitContainerStatuses {
				for _, term := range []*corev1.ContainerStateTerminated{st.State.Terminated, st.LastTerminationState.Terminated} {
					if st.Name == "fetch" && term != nil && term.ExitCode == 3 {
						node = p.Spec.NodeName
						return true, ""
					}
				}
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	}); err != nil {
		e.dumpPods(t, d.Namespace)
		t.Fatal(err)
	}
	st, err := e.state(ctx, node, d.key())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range st.summary.Failed {
		found = found || f.Image == missing
	}
	if st.label != "failed" || !found {
		t.Errorf("%s: label %q annotation %s, want failed naming %s", node, st.label, st.annotation, missing)
	}
	ds, err := e.cs.AppsV1().DaemonSets(d.Namespace).Get(ctx, d.dsName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := ds.Status; s.ObservedGeneration == ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled {
		t.Errorf("DaemonSet %s is rolled out although %s is missing on %s: the workloads' stage would proceed", d.dsName(), missing, node)
	}
	logf(t, "release v3: %s failed on %s, fetch exited 3, the rollout holds", missing, node)
}

// writeShopKustomization writes the release's kustomization: the app, the
// ImagePrefetcher with no image list, images: setting the release's tag,
// and the function as a transformer.
func writeShopKustomization(t *testing.T, dir, agentRef, release string) {
	t.Helper()
	files := map[string]string{
		"imageprefetcher.yaml": fmt.Sprintf(`apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: %s
  namespace: %s
spec:
  agent:
    image: %s
  imageListFrom:
    workloads:
    - namespace: %s
  rollout:
    requireAllImages: true
`, shopPrefetcher, shopPrefetcherNS, agentRef, shopNamespace),
		"function.yaml": fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: image-prefetcher-fn
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: %s
`, binPath("image-prefetcher-fn")),
	}
	var k strings.Builder
	k.WriteString("resources:\n- prefetch-namespace.yaml\n- imageprefetcher.yaml\n- app.yaml\nimages:\n")
	for _, repo := range shopRepos {
		fmt.Fprintf(&k, "- name: ghcr.io/%s\n  newTag: %s\n", repo, release)
	}
	k.WriteString("transformers:\n- function.yaml\n")
	files["kustomization.yaml"] = k.String()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// splitStages cuts a render in two, the way examples/flux/staged does:
// everything labelled part-of image-prefetcher, then the rest.
func splitStages(t *testing.T, rendered []byte) (prefetch, app []byte) {
	t.Helper()
	var first, second [][]byte
	for _, doc := range bytes.Split(rendered, []byte("\n---\n")) {
		var o unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &o.Object); err != nil {
			t.Fatalf("rendered output: %v", err)
		}
		if o.GetLabels()[partOfLabel] == partOfPrefetcher {
			first = append(first, doc)
		} else {
			second = append(second, doc)
		}
	}
	if len(first) == 0 || len(second) == 0 {
		t.Fatalf("the render does not split in two stages: %d prefetcher objects, %d others", len(first), len(second))
	}
	return bytes.Join(first, []byte("\n---\n")), bytes.Join(second, []byte("\n---\n"))
}

func assertRenderedList(t *testing.T, prefetch []byte, want []string) {
	t.Helper()
	for _, doc := range bytes.Split(prefetch, []byte("\n---\n")) {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(doc, &cm); err != nil || cm.Kind != "ConfigMap" {
			continue
		}
		var got []string
		for _, line := range strings.Split(cm.Data["images.txt"], "\n") {
			if line != "" && !strings.HasPrefix(line, "#") {
				got = append(got, line)
			}
		}
		sort.Strings(got)
		w := slices.Sorted(slices.Values(want))
		if !slices.Equal(got, w) {
			t.Fatalf("rendered list %q, want the workloads' images %q:\n%s", got, w, cm.Data["images.txt"])
		}
		return
	}
	t.Fatal("the prefetcher stage has no image-list ConfigMap")
}

// blobRequests counts the registry's blob requests per app repository.
func blobRequests(reg *registry.Registry) map[string]int {
	out := map[string]int{}
	for _, repo := range shopRepos {
		out[repo] = len(reg.Requests(registry.Match{Repo: repo, Kind: registry.Blobs}))
	}
	return out
}

// waitReleasePods waits until want pods of the app run the release's
// images and are ready, and no pod of another release is left, and returns
// them.
func (e env) waitReleasePods(t *testing.T, ctx context.Context, release string, want int) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var ready []corev1.Pod
	if err := poll(ctx, fmt.Sprintf("%d ready pods of release %s", want, release), func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(shopNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready = nil
		others := 0
		for _, p := range pods.Items {
			if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+release) {
				others++
				continue
			}
			if podReady(p) {
				ready = append(ready, p)
			}
		}
		return len(ready) == want && others == 0, fmt.Sprintf("%d ready, %d of other releases", len(ready), others)
	}); err != nil {
		e.dumpPods(t, shopNamespace)
		t.Fatal(err)
	}
	return ready
}

func podReady(p corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// assertAlreadyPresent checks each pod's kubelet events: a Pulled event
// saying its image was already present on the machine, and no Pulling.
func (e env) assertAlreadyPresent(t *testing.T, ctx context.Context, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		image := p.Spec.Containers[0].Image
		var pulled, pulling []string
		if err := poll(ctx, "the Pulled event of pod "+p.Name, func() (bool, string) {
			evs, err := e.cs.CoreV1().Events(shopNamespace).List(ctx, metav1.ListOptions{
				FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + p.Name + ",involvedObject.uid=" + string(p.UID),
			})
			if err != nil {
				return false, err.Error()
			}
			pulled, pulling = nil, nil
			for _, ev := range evs.Items {
				switch ev.Reason {
				case "Pulling":
					pulling = append(pulling, ev.Message)
				case "Pulled":
					pulled = append(pulled, ev.Message)
				}
			}
			return len(pulled) > 0, fmt.Sprintf("%d events", len(evs.Items))
		}); err != nil {
			t.Error(err)
			continue
		}
		for _, msg := range pulling {
			t.Errorf("pod %s on %s: the kubelet pulled: %s", p.Name, p.Spec.NodeName, msg)
		}
		for _, msg := range pulled {
			if !strings.Contains(msg, image) || !strings.Contains(msg, alreadyPresentMsg) {
				t.Errorf("pod %s on %s: Pulled event %q, want the image %s %s", p.Name, p.Spec.NodeName, msg, image, alreadyPresentMsg)
			}
		}
	}
}

// deleteNamespace deletes ns and waits until its pods are gone, so that
// the images they ran can be removed from the nodes.
func (e env) deleteNamespace(t *testing.T, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean-up: delete namespace %s: %v", ns, err)
		return
	}
	if err := poll(ctx, "namespace "+ns+" gone", func() (bool, string) {
		_, err := e.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	}); err != nil {
		t.Errorf("clean-up: %v", err)
	}
}

// forgetRefs removes refs from every node.
func forgetRefs(t *testing.T, refs []string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range c.Nodes() {
		for _, ref := range refs {
			if err := n.Remove(ctx, ref); err != nil {
				t.Errorf("clean-up: %v", err)
			}
		}
	}
}
