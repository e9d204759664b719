package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestOwnershipSameNameInstances: two teams each deploy an instance named
// web, in e2e-own-a and e2e-own-b, on the same nodes, with the real
// kube-apiserver, kubelets and containerd. They share the node key
// image-prefetcher.stackrox.io/web. Team a's list has a missing image, so
// its key says failed; team b's list is good. The first owner keeps the
// key: team b's pods report the conflict (fetch exits 4, an
// InstanceConflict Event, an error line naming both owners) and never
// change the key, not even to succeeded. Uninstalling team b leaves team
// a's label; uninstalling team a removes it.
func TestOwnershipSameNameInstances(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 2100, 64<<10, "own-a", "own-b")
	missing := "ghcr.io/e2e/own-never-pushed:v1"
	teamA := e.deployInstance(t, instance{Name: "web", Namespace: "e2e-own-a", Spec: yamlList([]string{refs[0], missing})})
	before := map[string]nodeState{}
	for _, n := range c.Nodes() {
		e.waitLabel(t, teamA, n.Name, "failed", labelWait)
	}
	// Both watch containers run: what they write from now on is final.
	e.waitRolledOut(t, teamA, len(c.Nodes()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	owner := `{"owner":{"namespace":"e2e-own-a","name":"web",`
	for _, n := range c.Nodes() {
		st, err := e.state(ctx, n.Name, teamA.key())
		if err != nil {
			t.Fatal(err)
		}
		if st.label != "failed" || !strings.HasPrefix(st.annotation, owner) {
			t.Fatalf("%s: team a's key is %q %s, want failed, owned by e2e-own-a/web", n.Name, st.label, st.annotation)
		}
		before[n.Name] = st
	}
	unchanged := func(when string) {
		t.Helper()
		for _, n := range c.Nodes() {
			st, err := e.state(ctx, n.Name, teamA.key())
			if err != nil {
				t.Fatal(err)
			}
			if st.label != before[n.Name].label || st.annotation != before[n.Name].annotation {
				t.Errorf("%s, %s: the key is %q %s, was team a's %q %s", when, n.Name, st.label, st.annotation, before[n.Name].label, before[n.Name].annotation)
			}
		}
	}

	start := time.Now()
	teamB := e.deployInstance(t, instance{Name: "web", Namespace: "e2e-own-b", Spec: yamlList(refs[1:])})
	for _, n := range c.Nodes() {
		pod := e.waitFetchExit(t, teamB, n.Name, 4)
		_, line := e.logLine(t, teamB.Namespace, pod, "fetch", start, "level=ERROR", "owner=e2e-own-a/web", "thisInstance=e2e-own-b/web")
		logf(t, "%s: %s", n.Name, line)
	}
	evs := e.waitEvent(t, teamB.Namespace, "InstanceConflict", corev1.EventTypeWarning)
	if m := evs[0].Message; !strings.Contains(m, "e2e-own-a/web") || !strings.Contains(m, "e2e-own-b/web") {
		t.Errorf("InstanceConflict Event %q does not name both owners", m)
	}
	// team b pulled its image before it found the key taken: only the
	// label is refused.
	assertImages(t, c.Nodes(), refs, true)
	unchanged("while team b's pods run")

	out, code := runStatus(t, ctx, "--instance", "web", "--namespace", teamB.Namespace)
	if code != 1 || strings.Count(out, "conflict on node") != len(c.Nodes()) || !strings.Contains(out, "owned by e2e-own-a/web, not by e2e-own-b/web") {
		t.Errorf("status --namespace %s exited %d, want 1 and a conflict on every node:\n%s", teamB.Namespace, code, out)
	}

	logf(t, "uninstalling team b")
	e.uninstall(ctx, t, teamB)
	unchanged("after team b was uninstalled")

	logf(t, "uninstalling team a")
	e.uninstall(ctx, t, teamA)
	for _, n := range c.Nodes() {
		e.waitNoKey(t, n.Name, teamA.key(), 10*time.Second)
	}
}

// waitFetchExit waits until the fetch init container of the instance's pod
// on node has exited with code, and returns the pod's name.
func (e env) waitFetchExit(t *testing.T, d *deployed, node string, code int32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), labelWait)
	defer cancel()
	var name string
	err := poll(ctx, fmt.Sprintf("fetch of %s/%s on %s exiting %d", d.Namespace, d.Name, node, code), func() (bool, string) {
		pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/instance=" + d.Name, FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			for _, st := range p.Status.InitContainerStatuses {
				if st.Name != "fetch" {
					continue
				}
				for _, term := range []*corev1.ContainerStateTerminated{st.State.Terminated, st.LastTerminationState.Terminated} {
					if term != nil && term.ExitCode == code {
						name = p.Name
						return true, ""
					}
				}
				return false, fmt.Sprintf("%s: fetch %+v", p.Name, st.State)
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	})
	if err != nil {
		e.dumpPods(t, d.Namespace)
		t.Fatal(err)
	}
	return name
}

// uninstall removes an instance as a user would: the DaemonSet and its
// pods first (each watch container then removes the key it owns), then the
// other objects. Unlike the clean-up, it strips no key by hand: what stays
// on the nodes is what the agents left.
func (e env) uninstall(ctx context.Context, t *testing.T, d *deployed) {
	t.Helper()
	e.deleteDaemonSet(ctx, t, d)
	for i := len(d.objs) - 1; i >= 0; i-- {
		o := d.objs[i]
		if o.GetKind() == "Namespace" || o.GetKind() == "DaemonSet" {
			continue
		}
		if err := e.deleteObject(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}
