package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// labelWatcher watches every Node and records each time the instance's
// label is not "succeeded", or its annotation is missing, from the moment
// it starts.
type labelWatcher struct {
	mu         sync.Mutex
	events     int
	violations []string
	stop       context.CancelFunc
	done       chan struct{}
}

func (e env) watchLabel(t *testing.T, key string) *labelWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	list, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for _, n := range list.Items {
		if n.Labels[key] != "succeeded" {
			cancel()
			t.Fatalf("%s: label %q before the watch starts", n.Name, n.Labels[key])
		}
	}
	w := &labelWatcher{stop: cancel, done: make(chan struct{})}
	rv := list.ResourceVersion
	go func() {
		defer close(w.done)
		// A watch may be closed by the apiserver; it is opened again from
		// the last version seen, so that no change is missed.
		for ctx.Err() == nil {
			wi, err := e.cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				if ctx.Err() == nil {
					w.record(fmt.Sprintf("watch: %v", err))
				}
				return
			}
			for ev := range wi.ResultChan() {
				n, ok := ev.Object.(*corev1.Node)
				if !ok {
					if ev.Type == watch.Error {
						if ctx.Err() == nil {
							w.record(fmt.Sprintf("watch error: %v", ev.Object))
						}
						wi.Stop()
						return
					}
					continue
				}
				rv = n.ResourceVersion
				if ev.Type == watch.Bookmark {
					continue
				}
				w.mu.Lock()
				w.events++
				w.mu.Unlock()
				if v := n.Labels[key]; v != "succeeded" || n.Annotations[key] == "" || ev.Type == watch.Deleted {
					w.record(fmt.Sprintf("%s %s: label %q, annotation %q at %s", ev.Type, n.Name, v, n.Annotations[key],
						time.Now().Format(time.RFC3339Nano)))
				}
			}
		}
	}()
	return w
}

func (w *labelWatcher) record(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, s)
}

func (w *labelWatcher) finish() (int, []string) {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events, w.violations
}

// A change of only the agent's resources rolls the DaemonSet, pod by pod.
// The images stay on the nodes, so the label must stay: a watch on the
// Nodes, open for the whole rollout, never sees the key leave
// "succeeded". Deleting the DaemonSet then still removes every key: the
// watch containers see their DaemonSet gone.
func TestRolloutKeepsTheLabel(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 1700, 64<<10, "rollout-a", "rollout-b")
	in := instance{Name: "rollout", Namespace: "e2e-rollout", Spec: yamlList(refs)}
	dir := e.kustomization(t, "", in)
	d := e.deploy(t, in, e.renderDir(t, dir))
	for _, n := range c.Nodes() {
		e.waitLabel(t, d, n.Name, "succeeded", labelWait)
	}
	before := e.waitRolledOut(t, d, 2)
	oldPods := e.podsOf(t, d)

	// The old pods' watch logs say why a key was kept or removed.
	var oldLogs sync.Map
	for _, p := range oldPods {
		go func() {
			raw, _ := e.cs.CoreV1().Pods(d.Namespace).GetLogs(p, &corev1.PodLogOptions{Container: "watch", Follow: true}).DoRaw(context.Background())
			oldLogs.Store(p, string(raw))
		}()
	}
	w := e.watchLabel(t, d.key())
	// Only the agent's resources change; `agent:` already holds the image.
	in.Spec = "    resources:\n      requests:\n        cpu: 7m\n        memory: 24Mi\n" + yamlList(refs)
	e.kustomization(t, dir, in)
	logf(t, "changing only the agent's resources and re-applying")
	e.reapply(t, d, e.renderDir(t, dir))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := poll(ctx, "the DaemonSet rolled to the new pods", func() (bool, string) {
		ds, err := e.cs.AppsV1().DaemonSets(d.Namespace).Get(ctx, d.dsName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pods := e.podsOf(t, d)
		fresh := len(pods) == 2
		for _, p := range pods {
			for _, o := range oldPods {
				if p == o {
					fresh = false
				}
			}
		}
		st := ds.Status
		return ds.Generation > before.Generation && st.ObservedGeneration >= ds.Generation && st.UpdatedNumberScheduled == 2 && st.NumberAvailable == 2 && fresh,
			fmt.Sprintf("generation %d/%d updated %d available %d pods %v", st.ObservedGeneration, ds.Generation, st.UpdatedNumberScheduled, st.NumberAvailable, pods)
	}); err != nil {
		t.Fatal(err)
	}
	// The new pods' fetch has labeled (they are available); let their
	// watch run a check too.
	for _, n := range c.Nodes() {
		e.waitLabel(t, d, n.Name, "succeeded", labelWait)
	}
	time.Sleep(3 * time.Second)
	events, violations := w.finish()
	logf(t, "the Node watch saw %d changes during the rollout", events)
	for _, v := range violations {
		t.Errorf("the label left succeeded during the rollout: %s", v)
	}
	if len(violations) > 0 {
		oldLogs.Range(func(p, l any) bool {
			logf(t, "watch log of the old pod %s:\n%s", p, tailLines(l.(string), 15))
			return true
		})
	}
	if events == 0 {
		t.Error("the Node watch saw no change at all; it did not watch the rollout")
	}

	// Deleting the DaemonSet removes every key.
	e.deleteDaemonSet(ctx, t, d)
	for _, n := range c.Nodes() {
		e.waitNoKey(t, n.Name, d.key(), time.Minute)
	}
}
