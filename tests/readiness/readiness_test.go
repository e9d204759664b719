package readiness_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

const startupKey = "startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pushApp pushes a runnable image (a static binary that blocks until
// SIGTERM) as readiness/app:v1.
func pushApp(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.PushPause(ctx, "readiness/app:v1", "65532:65532"); err != nil {
		t.Fatal(err)
	}
	return "ghcr.io/readiness/app:v1"
}

// workload creates a Deployment of one pod pinned to node by hostname,
// without the prefetcher's label selector and without tolerations.
func workload(t *testing.T, ns, name, nodeName, image string) {
	t.Helper()
	one := int32(1)
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": nodeName},
					Containers: []corev1.Container{{
						Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
					}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func workloadPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return nil, err
	}
	if len(pods.Items) != 1 {
		return nil, fmt.Errorf("%d pods of %s", len(pods.Items), name)
	}
	return &pods.Items[0], nil
}

func readyAt(n *corev1.Node) time.Time {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return cond.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// runningAt is when the pod's container started.
func runningAt(p *corev1.Pod) time.Time {
	for _, st := range p.Status.ContainerStatuses {
		if st.State.Running != nil {
			return st.State.Running.StartedAt.Time
		}
	}
	return time.Time{}
}

// waitRunning waits until the workload's container runs, and returns the
// pod and when the wait (polling every 200 ms) saw it running.
func waitRunning(t *testing.T, ns, name string, timeout time.Duration) (*corev1.Pod, time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var pod *corev1.Pod
	if err := poll(ctx, name+" running", func() (bool, string) {
		p, err := workloadPod(ctx, ns, name)
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return !runningAt(p).IsZero(), string(p.Status.Phase)
	}); err != nil {
		t.Fatal(err)
	}
	return pod, time.Now()
}

func blobRequests(repo string) int {
	return len(c.Registry().Requests(registry.Match{Repo: repo, Kind: registry.Blobs}))
}

// TestStartupTaintNewNode: with the instance deployed, a third node joins
// with --register-with-taints=<key>=:NoSchedule. A Deployment pinned to it,
// without the prefetcher's selector or a toleration, stays Pending while
// the taint is there, and once the agent removed it, starts without a
// single blob request for its image: the image was already on the node. A
// fourth node joins without the taint, for the time from node Ready to the
// workload Running without prefetching.
func TestStartupTaintNewNode(t *testing.T) {
	setup(t)
	app := pushApp(t)
	data := pushData(t, 1701, "data", 8<<20, 8<<20)
	in := deploy(t, "warm", fmt.Sprintf("  images:\n  - %s\n  - %s\n  startupTaint:\n    key: %s\n", app, data, startupKey))
	for _, n := range c.Nodes() {
		waitLabel(t, in, n.Name, "succeeded", 3*time.Minute)
	}
	if _, err := c.CreateNamespace(context.Background(), "apps"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), "apps", metav1.DeleteOptions{}) })

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tainted := cluster.NodeName(len(c.Nodes()))
	workload(t, "apps", "warm-app", tainted, app)
	n3, err := c.AddNode(ctx, cluster.JoinOptions{KubeletArgs: []string{"--register-with-taints=" + startupKey + "=:NoSchedule"}})
	if err != nil {
		t.Fatal(err)
	}
	warmReady := time.Now() // AddNode polls for Ready every 200 ms
	if !cluster.HasTaint(node(t, n3.Name), startupKey) {
		t.Fatalf("%s joined without the startup taint: %v", n3.Name, node(t, n3.Name).Spec.Taints)
	}

	// While the taint is there the workload is not scheduled; the moment it
	// goes, the label is already succeeded.
	var blobsAtRemoval int
	start := time.Now()
	if err := poll(ctx, "the startup taint removed from "+n3.Name, func() (bool, string) {
		// The pod first: a pod found scheduled on a node read after it
		// with the taint was scheduled while the taint was there. (Read
		// the other way round, the taint may go between the two reads.)
		p, perr := workloadPod(ctx, "apps", "warm-app")
		n, err := cs.CoreV1().Nodes().Get(ctx, n3.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if cluster.HasTaint(n, startupKey) {
			if perr == nil && p.Spec.NodeName != "" {
				t.Errorf("the workload was scheduled to %s while the startup taint was there", p.Spec.NodeName)
			}
			return false, fmt.Sprintf("label %q", n.Labels[in.key()])
		}
		blobsAtRemoval = blobRequests("readiness/app")
		if v := n.Labels[in.key()]; v != "succeeded" {
			t.Errorf("the taint went with the label %q, not succeeded", v)
		}
		return true, ""
	}); err != nil {
		dumpPods(t, in.name)
		t.Fatal(err)
	}
	t.Logf("%s: startup taint removed %.1fs after the node was Ready", n3.Name, time.Since(start).Seconds())
	pod, warmRunning := waitRunning(t, "apps", "warm-app", 2*time.Minute)
	if got := blobRequests("readiness/app") - blobsAtRemoval; got != 0 {
		t.Errorf("the registry served %d blob requests for %s after the taint was removed, want 0", got, app)
	}
	warm := warmRunning.Sub(warmReady)
	t.Logf("%s by the API's timestamps (1 s resolution): Ready %s, container started %s", n3.Name, readyAt(node(t, n3.Name)).Format(time.TimeOnly), runningAt(pod).Format(time.TimeOnly))
	ev := waitEvent(t, in.name, "StartupTaintRemoved", time.Minute)
	if ev.Type != corev1.EventTypeNormal || !strings.Contains(ev.Message, n3.Name) {
		t.Errorf("Event %s %q", ev.Type, ev.Message)
	}
	if evs := events(t, in.name, "StartupTaintTimeout"); len(evs) != 0 {
		t.Errorf("StartupTaintTimeout Events: %v", evs)
	}

	// status says the taint is gone from every node (the OWNER column,
	// namespace/instance, stands between STATE and STARTUP-TAINT).
	out, err := c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--kubeconfig", c.Kubeconfig, "--instance", in.name).CombinedOutput()
	if err != nil {
		t.Errorf("status: %v\n%s", err, out)
	}
	t.Logf("status:\n%s", out)
	// Columns: NODE INSTANCE STATE OWNER STARTUP-TAINT PRESENT FAILURES.
	rows := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	for _, n := range c.Nodes() {
		if f := rows[n.Name]; len(f) < 5 || f[1] != "warm" || f[2] != "succeeded" || f[3] != "warm/warm" || f[4] != "absent" {
			t.Errorf("status does not show %s succeeded, owned by warm/warm, with the taint absent:\n%s", n.Name, out)
		}
	}

	// The same workload on a node that joins without the taint: it starts
	// as soon as the node is Ready and pulls its image itself.
	plain := cluster.NodeName(len(c.Nodes()))
	workload(t, "apps", "cold-app", plain, app)
	blobsBefore := blobRequests("readiness/app")
	n4, err := c.AddNode(ctx, cluster.JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	coldReady := time.Now()
	pod, coldRunning := waitRunning(t, "apps", "cold-app", 2*time.Minute)
	cold := coldRunning.Sub(coldReady)
	t.Logf("%s by the API's timestamps (1 s resolution): Ready %s, container started %s", n4.Name, readyAt(node(t, n4.Name)).Format(time.TimeOnly), runningAt(pod).Format(time.TimeOnly))
	t.Logf("node Ready to workload Running: %s with the startup taint (the images prefetched first), %s without it (the workload pulled its image itself: %d blob requests)",
		warm.Round(100*time.Millisecond), cold.Round(100*time.Millisecond), blobRequests("readiness/app")-blobsBefore)
}

// TestStartupTaintAdmission: with the token the kubelet mounted into the
// agent's pod, the agent may remove taints with its key from its own node,
// and nothing else.
func TestStartupTaintAdmission(t *testing.T) {
	setup(t)
	const key = "example.com/guard"
	img := pushData(t, 1702, "guard", 64<<10)
	n1, n2 := c.Nodes()[0], c.Nodes()[1]
	in := deploy(t, "guard", fmt.Sprintf("  images:\n  - %s\n  nodeSelector:\n    e2e.image-prefetcher.io/node: %s\n  startupTaint:\n    key: %s\n", img, n1.Name, key))
	waitLabel(t, in, n1.Name, "succeeded", 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pod := agentPod(t, in, n1.Name)
	glob := fmt.Sprintf("%s/kubelet/pods/%s/volumes/kubernetes.io~projected/*/token", n1.Dir, pod.UID)
	tok, err := n1.Command(ctx, "sh", "-c", "cat "+glob).Output()
	if err != nil || len(tok) == 0 {
		t.Fatalf("read the token of pod %s: %v", pod.Name, err)
	}
	cfg, err := c.RESTConfigForToken(strings.TrimSpace(string(tok)))
	if err != nil {
		t.Fatal(err)
	}
	agent, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	own := corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	start := []corev1.Taint{own, other}
	// The agent itself removes its key's taint whenever it sees it (its
	// watch may start after the cases below put the taint back). A second
	// holder of the key that waits for its images, as another instance
	// sharing the key registers, makes it wait instead, so that only the
	// cases' own patches change the taints.
	holder := labelDomain + "guard-holder"
	hold := fmt.Sprintf(`{"metadata":{"labels":{%q:"failed"},"annotations":{%q:%q}}}`, holder, holder, `{"total":1,"present":0,"failed":[],"startupTaint":"`+key+`"}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n1.Name, types.MergePatchType, []byte(hold), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		setTaints(t, n1.Name)
		setTaints(t, n2.Name)
		unhold := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}},"spec":{"unschedulable":null}}`, holder, holder)
		_, _ = cs.CoreV1().Nodes().Patch(context.Background(), n1.Name, types.MergePatchType, []byte(unhold), metav1.PatchOptions{})
	})
	// The apiserver starts enforcing a new ValidatingAdmissionPolicy a
	// moment after it is created: wait until a change the policy denies is
	// denied (a dry run, which admission sees but nothing stores), so that
	// the cases below test the policy, not its start-up.
	if err := cluster.Poll(ctx, 200*time.Millisecond, "the instance's admission policy in force", func() (bool, string) {
		_, err := agent.CoreV1().Nodes().Patch(ctx, n1.Name, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return false, "a dry-run spec change was allowed"
		}
		return strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'image-prefetcher.guard.guard'"), err.Error()
	}); err != nil {
		t.Fatal(err)
	}
	jsonPatch := func(want []corev1.Taint) []byte {
		return fmt.Appendf(nil, `[{"op":"test","path":"/spec/taints","value":%s},{"op":"replace","path":"/spec/taints","value":%s}]`, mustJSON(start), mustJSON(want))
	}
	for _, tc := range []struct {
		name    string
		node    string
		pt      types.PatchType
		patch   []byte
		allowed bool
	}{
		{"remove its own key's taint", n1.Name, types.JSONPatchType, jsonPatch([]corev1.Taint{other}), true},
		{"remove another taint", n1.Name, types.JSONPatchType, jsonPatch([]corev1.Taint{own}), false},
		{"add a taint", n1.Name, types.JSONPatchType, jsonPatch([]corev1.Taint{own, other, {Key: "new", Effect: corev1.TaintEffectNoSchedule}}), false},
		{"remove its key's taint on another node", n2.Name, types.JSONPatchType, jsonPatch([]corev1.Taint{other}), false},
		{"set spec.unschedulable", n1.Name, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setTaints(t, n1.Name, start...)
			setTaints(t, n2.Name, start...)
			_, err := agent.CoreV1().Nodes().Patch(ctx, tc.node, tc.pt, tc.patch, metav1.PatchOptions{})
			switch {
			case tc.allowed && err != nil:
				t.Errorf("denied: %v", err)
			case !tc.allowed && err == nil:
				t.Errorf("allowed")
			case !tc.allowed && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'image-prefetcher.guard.guard'"):
				t.Errorf("denied, but not by the instance's policy: %v", err)
			}
			if t.Failed() {
				t.Logf("taints now: %v", node(t, tc.node).Spec.Taints)
			}
		})
	}
}

// TestStartupTaintRegistryDown: the registry answers 503 for the whole set;
// at maxWait after the agent's pod started the taint goes anyway, with a
// Warning Event, while the pulls still retry.
func TestStartupTaintRegistryDown(t *testing.T) {
	setup(t)
	const key = "example.com/registry-down"
	const maxWait = 15 * time.Second
	img := pushData(t, 1703, "down", 64<<10)
	c.Registry().Fail(registry.Match{Repo: "readiness/down"}, 503, 0)
	t.Cleanup(c.Registry().ClearFaults)
	n1 := c.Nodes()[0]
	setTaints(t, n1.Name, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() { setTaints(t, n1.Name) })
	in := deploy(t, "down", fmt.Sprintf("  images:\n  - %s\n  nodeSelector:\n    e2e.image-prefetcher.io/node: %s\n  pull:\n    overallTimeout: 10m\n  startupTaint:\n    key: %s\n    maxWait: %s\n", img, n1.Name, key, maxWait))

	ev := waitEvent(t, in.name, "StartupTaintTimeout", 2*time.Minute)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, key) {
		t.Errorf("Event %s %q", ev.Type, ev.Message)
	}
	n := node(t, n1.Name)
	if cluster.HasTaint(n, key) {
		t.Errorf("the taint is still there after the StartupTaintTimeout Event: %v", n.Spec.Taints)
	}
	if v := n.Labels[in.key()]; v == "succeeded" {
		t.Errorf("label %q with the registry down", v)
	}
	pod := agentPod(t, in, n1.Name)
	if waited := ev.FirstTimestamp.Sub(pod.Status.StartTime.Time); waited < maxWait-time.Second {
		t.Errorf("removed %s after the pod started, before maxWait %s", waited, maxWait)
	} else {
		t.Logf("removed %s after the pod started (maxWait %s): %s", waited, maxWait, ev.Message)
	}
	if got := len(c.Registry().Requests(registry.Match{Repo: "readiness/down"})); got == 0 {
		t.Error("the agent never asked the registry")
	}
}

// TestStartupTaintMaxWaitZero: with maxWait 0 a missing image keeps the
// taint; once the registry has it, watch pulls it at its next check and the
// taint goes.
func TestStartupTaintMaxWaitZero(t *testing.T) {
	setup(t)
	const key = "example.com/keep"
	img := pushData(t, 1704, "keep", 64<<10)
	c.Registry().Fail(registry.Match{Repo: "readiness/keep"}, 404, 0)
	t.Cleanup(c.Registry().ClearFaults)
	n1 := c.Nodes()[0]
	setTaints(t, n1.Name, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() { setTaints(t, n1.Name) })
	in := deployRefresh(t, "keep", fmt.Sprintf("  images:\n  - %s\n  nodeSelector:\n    e2e.image-prefetcher.io/node: %s\n  startupTaint:\n    key: %s\n    maxWait: 0\n", img, n1.Name, key), 5*time.Second)
	waitLabel(t, in, n1.Name, "failed", 3*time.Minute)
	// A few of the agent's polls (every 5 s) and watch's checks.
	time.Sleep(15 * time.Second)
	if n := node(t, n1.Name); !cluster.HasTaint(n, key) || n.Labels[in.key()] != "failed" {
		t.Fatalf("with maxWait 0 and the image missing: label %q, taints %v; want failed and the taint kept", n.Labels[in.key()], n.Spec.Taints)
	}
	c.Registry().ClearFaults()
	waitLabel(t, in, n1.Name, "succeeded", 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := poll(ctx, "the taint removed", func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, n1.Name, metav1.GetOptions{})
		return err == nil && !cluster.HasTaint(n, key), fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, in.name, "StartupTaintRemoved", time.Minute); ev.Type != corev1.EventTypeNormal {
		t.Errorf("Event type %s", ev.Type)
	}
	if evs := events(t, in.name, "StartupTaintTimeout"); len(evs) != 0 {
		t.Errorf("StartupTaintTimeout with maxWait 0: %v", evs)
	}
}

// TestStartupTaintAgentKilledMidPull: the fetch container is killed while
// its pull hangs on a stalled blob. The taint stays, the kubelet restarts
// fetch, the restarted agent pulls the image and only then removes the
// taint.
func TestStartupTaintAgentKilledMidPull(t *testing.T) {
	setup(t)
	const key = "example.com/killed"
	img, err := ociimage.Data(1705, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := c.Push(ctx, img, "readiness/killed:v1"); err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	digest, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg := c.Registry()
	reg.Stall(registry.Match{Ref: digest.String()}, 1, 0)
	t.Cleanup(reg.ClearFaults)
	n2 := c.Nodes()[1]
	setTaints(t, n2.Name, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() { setTaints(t, n2.Name) })

	// Every state the node goes through: the taint must never go before
	// the label is succeeded.
	var mu sync.Mutex
	var seen []string
	watchCtx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for watchCtx.Err() == nil {
			if n, err := cs.CoreV1().Nodes().Get(watchCtx, n2.Name, metav1.GetOptions{}); err == nil {
				s := fmt.Sprintf("taint=%v label=%q", cluster.HasTaint(n, key), n.Labels["image-prefetcher.stackrox.io/killed"])
				mu.Lock()
				if len(seen) == 0 || seen[len(seen)-1] != s {
					seen = append(seen, s)
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	in := deploy(t, "killed", fmt.Sprintf("  images:\n  - ghcr.io/readiness/killed:v1\n  nodeSelector:\n    e2e.image-prefetcher.io/node: %s\n  startupTaint:\n    key: %s\n    maxWait: 0\n", n2.Name, key))

	if err := poll(ctx, "the stalled blob requested", func() (bool, string) {
		return reg.Stats().BlobTransfers > 0, ""
	}); err != nil {
		t.Fatal(err)
	}
	cri, err := n2.CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	list, err := cri.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.container.name": "fetch", "io.kubernetes.pod.namespace": in.name},
	}})
	if err != nil || len(list.Containers) != 1 {
		t.Fatalf("the running fetch container: %v (found %d)", err, len(list.Containers))
	}
	if _, err := cri.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: list.Containers[0].Id, Timeout: 0}); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed fetch mid-pull (container %s)", list.Containers[0].Id[:12])
	if !cluster.HasTaint(node(t, n2.Name), key) {
		t.Fatal("the taint went when the agent was killed")
	}

	waitLabel(t, in, n2.Name, "succeeded", 3*time.Minute)
	if err := poll(ctx, "the taint removed", func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, n2.Name, metav1.GetOptions{})
		return err == nil && !cluster.HasTaint(n, key), fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
	stopWatch()
	wg.Wait()
	t.Logf("node states: %s", strings.Join(seen, " -> "))
	for _, s := range seen {
		if strings.HasPrefix(s, "taint=false") && !strings.HasSuffix(s, `label="succeeded"`) {
			t.Errorf("the taint was gone while %s", s)
		}
	}
	pod := agentPod(t, in, n2.Name)
	restarts := int32(0)
	for _, st := range pod.Status.InitContainerStatuses {
		restarts += st.RestartCount
	}
	if restarts < 1 {
		t.Errorf("fetch restarts %d, want at least 1", restarts)
	}
	var statuses []int
	for _, r := range reg.Requests(registry.Match{Ref: digest.String(), Kind: registry.Blobs}) {
		statuses = append(statuses, r.Status)
	}
	sort.Ints(statuses)
	t.Logf("blob requests for the stalled layer: %v", statuses)
	if ev := waitEvent(t, in.name, "StartupTaintRemoved", time.Minute); ev.Type != corev1.EventTypeNormal {
		t.Errorf("Event type %s", ev.Type)
	}
}
