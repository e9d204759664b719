package interact_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
)

// waitRolledOut waits until the controller has rolled the instance's
// DaemonSet's current generation out to want ready pods. The current
// generation is read first, by a list the apiserver serves consistently:
// the watch's first list asks for any version, and the watch cache may
// still hold the DaemonSet from before an update, fully rolled out (a
// fresh-clone run failed so).
func waitRolledOut(t *testing.T, in *instance, want int32) {
	t.Helper()
	list, err := cs.AppsV1().DaemonSets(in.namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + in.name})
	if err != nil {
		t.Fatalf("list the DaemonSet of %s: %v", in.name, err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d DaemonSets of %s, want 1", len(list.Items), in.name)
	}
	gen := list.Items[0].Generation
	waitDaemonSet(t, in, fmt.Sprintf("rolled out generation %d to %d ready pods", gen, want), func(ds *appsv1.DaemonSet) bool {
		s := ds.Status
		return ds.Generation >= gen && s.ObservedGeneration == ds.Generation && s.DesiredNumberScheduled == want && s.UpdatedNumberScheduled == want && s.NumberReady == want && s.NumberAvailable == want
	})
}

// waitWatching waits until the watch of each of the instance's pods has
// said that it is watching (cluster.Log.Watching): a SIGTERM before then
// ends it without settling the key.
func waitWatching(t *testing.T, in *instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range podsOf(t, in) {
		w, err := c.FollowLog(ctx, in.namespace, p.Name, "watch")
		if err == nil {
			err = w.Watching(ctx)
		}
		if err != nil {
			t.Fatalf("%s/%s: %v", in.namespace, p.Name, err)
		}
	}
}

// waitDaemonSet waits, on a watch of the instance's DaemonSet, until cond
// holds.
func waitDaemonSet(t *testing.T, in *instance, what string, cond func(*appsv1.DaemonSet) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.AppsV1().RESTClient(), "daemonsets", in.namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/instance=" + in.name
	})
	last := ""
	if _, err := until(ctx, lw, &appsv1.DaemonSet{}, func(ds *appsv1.DaemonSet) bool {
		s := ds.Status
		last = fmt.Sprintf("generation %d/%d desired %d updated %d ready %d", s.ObservedGeneration, ds.Generation, s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberReady)
		return cond(ds)
	}); err != nil {
		dumpPods(t, in.namespace)
		t.Fatalf("DaemonSet of %s not %s: %v (last: %s)", in.name, what, err, last)
	}
}

// The key stays across a rollout that keeps the list, for names and
// layerings where the agent once lost its DaemonSet (issue 26, findings 3
// and 4): a 63-character instance name, whose pods' generated names the
// apiserver cuts, and a namePrefix applied above the function, which
// renames the DaemonSet after the function rendered the RBAC. With herd
// control on, fetch reads the herd's size from that DaemonSet and takes a
// slot. A watch on the node, open for the whole rollout, must never see
// the key leave succeeded; the image stays pinned under the instance's
// mark (an agent upgrade rolls the same way: tests/e2e's nodes cannot
// pin); deleting the DaemonSet then removes the key.
func rolloutKeepsTheKey(t *testing.T) {
	for i, tc := range []struct {
		name, above string
	}{
		{strings.Repeat("long", 15) + "abc", ""},
		{"prefixed", "namePrefix: p-\n"},
	} {
		t.Run(fmt.Sprintf("%d-characters%s", len(tc.name), map[bool]string{true: "-namePrefix-above"}[tc.above != ""]), func(t *testing.T) {
			t.Parallel()
			img := c.PushData(t, int64(2610+i), 64<<10, "keep-"+fmt.Sprint(i))[0]
			herd := "  pull:\n    maxConcurrentNodes: 1\n" + pinBudget
			in := &instance{name: tc.name, namespace: fmt.Sprintf("interact-keep-%d", i), above: tc.above, spec: images(img) + nodeSpec(i) + herd}
			deploy(t, in)
			node := nodeName(i)
			waitNode(t, node, "labeled, the image pinned", 2*time.Minute, func(n *corev1.Node) (bool, string) {
				return n.Labels[in.key()] == "succeeded" && pinsImages(n, in.key(), 1), keyState(n, in.key(), "")
			})
			mark := pin.MarkKey(in.namespace, in.name)
			if pinned, l := pinOf(t, i, img); !pinned || l[mark] == "" {
				t.Errorf("%s: CRI pinned %v, labels %v: want pinned under %s", img, pinned, l, mark)
			}
			waitRolledOut(t, in, 1)
			old := podsOf(t, in)
			if log := podLog(t, old[0], "fetch"); !strings.Contains(log, `msg="acquired pull slot"`) || strings.Contains(log, "cannot read the DaemonSet's size") {
				t.Errorf("fetch did not read its DaemonSet's size, or took no slot:\n%s", tail(log, 12))
			}
			w := watchKey(t, node, in.key())
			// Only the agent's resources change (under spec.agent, which
			// holds the image): the same list.
			in.spec = "    resources:\n      requests:\n        cpu: 7m\n" + images(img) + nodeSpec(i) + herd
			update(t, in)
			waitRolledOut(t, in, 1)
			now := podsOf(t, in)
			if len(now) != 1 || len(old) != 1 || now[0].UID == old[0].UID {
				t.Fatalf("no new pod: before %d, after %d", len(old), len(now))
			}
			if seen := w.finish(); !slices.Equal(seen, []string{"succeeded"}) {
				t.Errorf("the label took the values %q during a rollout that kept the list, want succeeded throughout", seen)
			}
			checked := func(n *corev1.Node) (bool, string) {
				s, err := label.Parse(n.Annotations[in.key()])
				ok := err == nil && s.Pod == string(now[0].UID) && pinsImages(n, in.key(), 1)
				return ok, keyState(n, in.key(), "")
			}
			waitNode(t, node, "the new pod's check written, the image pinned", 2*time.Minute, checked)
			if pinned, l := pinOf(t, i, img); !pinned || l[mark] == "" {
				t.Errorf("%s after the rollout: CRI pinned %v, labels %v: want still pinned under %s",
					img, pinned, l, mark)
			}
			if err := cs.AppsV1().DaemonSets(in.namespace).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + in.name}); err != nil {
				t.Fatal(err)
			}
			waitNode(t, node, "the key gone with the DaemonSet", 2*time.Minute, func(n *corev1.Node) (bool, string) {
				_, has := n.Labels[in.key()]
				return !has, keyState(n, in.key(), "")
			})
		})
	}
}

// A rollout that changes the list while the new agent image cannot be
// pulled: the old pod's watch sees the DaemonSet's template carry another
// list and marks the key failed; the new pod never runs; the key must stay
// failed, never succeeded for a list the node does not have (issue 26,
// finding 6).
//
// The pins: one image leaves the list. The old pod knows only the new
// list's digest, not its images, so it leaves its pins as they are (only a
// pod whose instance no longer covers the node removes them): the image
// that left stays pinned under the instance's mark while no new pod runs.
// A rollout with an agent image that can be pulled then runs the new
// list's first check, which unpins it and pins the new image.
func rolloutChangingTheListWithoutAnAgent(t *testing.T) {
	left := c.PushData(t, 2620, 64<<10, "roll-left")[0]
	kept := c.PushData(t, 2622, 64<<10, "roll-kept")[0]
	added := c.PushData(t, 2621, 64<<10, "roll-new")[0]
	in := deploy(t, &instance{name: "roll", namespace: "interact-roll", spec: images(left, kept) + nodeSpec(1) + pinBudget})
	node := nodeName(1)
	waitNode(t, node, "labeled, both images pinned", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[in.key()] == "succeeded" && pinsImages(n, in.key(), 2), keyState(n, in.key(), "")
	})
	waitRolledOut(t, in, 1)
	waitWatching(t, in) // its watch marks the key failed
	mark := pin.MarkKey(in.namespace, in.name)
	for _, ref := range []string{left, kept} {
		if pinned, l := pinOf(t, 1, ref); !pinned || l[mark] == "" {
			t.Errorf("%s: CRI pinned %v, labels %v: want pinned under %s", ref, pinned, l, mark)
		}
	}
	w := watchKey(t, node, in.key())
	in.spec = images(kept, added) + nodeSpec(1) + pinBudget
	in.agentImage = strings.Replace(agentRef, ":", ":missing-", 1)
	update(t, in)
	n := waitNode(t, node, "the key failed", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[in.key()] == "failed", keyState(n, in.key(), "")
	})
	if ann := n.Annotations[in.key()]; !strings.Contains(ann, `"reason":"ListChanged"`) {
		t.Errorf("the annotation does not say the list changed: %s", ann)
	}
	// The new pod cannot start: its agent image does not exist.
	waitPod(t, in, "failing to pull its agent image", func(p *corev1.Pod) bool {
		for _, st := range p.Status.InitContainerStatuses {
			if w := st.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				return true
			}
		}
		return false
	})
	if seen := w.finish(); slices.Contains(seen[1:], "succeeded") || seen[len(seen)-1] != "failed" {
		t.Errorf("the label took the values %q, want succeeded, then failed for good", seen)
	}
	// The old pod has terminated, and left its pins.
	if pinned, l := pinOf(t, 1, left); !pinned || l[mark] == "" {
		t.Errorf("%s, which left the list, with no new pod running: CRI pinned %v, labels %v: want still pinned under %s", left, pinned, l, mark)
	}

	// An agent image that can be pulled: the new list's first check.
	in.agentImage = ""
	update(t, in)
	waitNode(t, node, "labeled for the new list, its images pinned", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[in.key()] == "succeeded" && pinsImages(n, in.key(), 2), keyState(n, in.key(), "")
	})
	if pinned, l := pinOf(t, 1, left); pinned || l[mark] != "" || l[pin.PinLabel] != "" || l[pin.SetByKey] != "" {
		t.Errorf("%s, which left the list: CRI pinned %v, labels %v: want unpinned, no label of this project", left, pinned, l)
	}
	for _, ref := range []string{kept, added} {
		if pinned, l := pinOf(t, 1, ref); !pinned || l[mark] == "" {
			t.Errorf("%s: CRI pinned %v, labels %v: want pinned under %s", ref, pinned, l, mark)
		}
	}
}

// waitPod waits, on a watch of the instance's pods, until one satisfies
// cond.
func waitPod(t *testing.T, in *instance, what string, cond func(*corev1.Pod) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", in.namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/instance=" + in.name
	})
	if _, err := until(ctx, lw, &corev1.Pod{}, cond); err != nil {
		dumpPods(t, in.namespace)
		t.Fatalf("no pod of %s %s: %v", in.name, what, err)
	}
}
