// Package hits_test runs `image-prefetcher status --hits` against a real
// kubelet: pods that start with an image of the instance's list on a node
// labeled succeeded are hits when it was prefetched and misses when it was
// not, as the kubelet's own Events say; the view reads them with a user's
// kubeconfig that the agent's ServiceAccount could not replace. It also
// records those Events for agent/hits' unit tests (-update), and checks
// that the kubelet still words them as recorded.
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/hits/ (after `make build
// tools host-deps kube`).
package hits_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/image-prefetcher/image-prefetcher/agent/hits"
	"github.com/image-prefetcher/image-prefetcher/agent/hits/recorded"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

var update = flag.Bool("update", false, "record the kubelet's Events into agent/hits/testdata/recorded.json")

var c *cluster.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(cluster.RunMain(m, cluster.Options{Deploys: true, Nodes: 1}, &c))
}

const (
	instance = "hits"
	apps     = "apps"
)

// TestHitsView: the list holds one image, written in full
// (docker.io/library/present:v1). The node is labeled succeeded. Then a
// second image is added to the list ConfigMap, which the running agent
// does not read again: the node has not prefetched it, and its label
// still says succeeded, as after any list change until the agents catch
// up. Three pods start on the node: one names the first image by its
// short name (present:v1), one the added image, one an image of no list.
func TestHitsView(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	node := c.Nodes()[0].Name
	// Each image its own user, so its own config and digest: images of one
	// digest are one image to containerd.
	for i, repo := range []string{"library/present:v1", "e2e/added:v1", "e2e/other:v1"} {
		if err := c.PushPause(ctx, repo, fmt.Sprintf("%d:%d", 65532-i, 65532-i)); err != nil {
			t.Fatal(err)
		}
	}
	agentRef, _, err := c.PushProjectImages(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	p := cluster.Prefetcher{Name: instance, Namespace: instance, AgentImage: agentRef, Spec: "  images:\n  - docker.io/library/present:v1\n"}
	manifests, err := p.Render(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	key := v1alpha1.NodeKey(instance)
	if _, err := c.WaitNode(ctx, node, func(n *corev1.Node) bool { return n.Labels[key] == v1alpha1.LabelSucceeded }); err != nil {
		c.DumpLogs(t)
		t.Fatalf("label %s: %v", key, err)
	}

	// watch reads the list once, when it starts: once it says so, the
	// ConfigMap may change under it.
	agents, err := c.WaitPodsRunning(ctx, instance, "app.kubernetes.io/instance="+instance, 1)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := c.FollowLog(ctx, instance, agents[0].Name, "watch")
	if err == nil {
		err = watch.Wait(ctx, regexp.MustCompile(`msg=watching .*images=1 `))
	}
	if err != nil {
		t.Fatal(err)
	}
	ds, cm := instanceObjects(ctx, t, cs)
	cm.Data[v1alpha1.ImageListKey] += "ghcr.io/e2e/added:v1\n"
	if _, err := cs.CoreV1().ConfigMaps(instance).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := c.CreateNamespace(ctx, apps); err != nil {
		t.Fatal(err)
	}
	pods := map[string]string{"hit": "present:v1", "miss": "ghcr.io/e2e/added:v1", "other": "ghcr.io/e2e/other:v1"}
	for name, image := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: apps, Labels: map[string]string{"app": "hits"}},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{v1alpha1.NodeKey(instance): v1alpha1.LabelSucceeded},
				Containers:   []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
			},
		}
		if _, err := cs.CoreV1().Pods(apps).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitPodsRunning(ctx, apps, "app=hits", len(pods)); err != nil {
		t.Fatal(err)
	}
	// The kubelet sends its Events apart from starting the containers.
	pulled := waitPulled(ctx, t, cs, len(pods))
	if *update {
		record(ctx, t, cs, node, ds.Name, cm.Data[v1alpha1.ImageListKey])
	}

	t.Run("kubelet words", func(t *testing.T) { kubeletWords(ctx, t, cs) })
	t.Run("events.k8s.io", func(t *testing.T) { sameEventsBothAPIs(ctx, t, cs, pulled) })
	t.Run("agent cannot read Events", func(t *testing.T) { agentCannotList(ctx, t, cs, ds.Spec.Template.Spec.ServiceAccountName) })

	kubeconfig := viewer(ctx, t, cs)
	out, err := c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--hits", "-o", "json", "--kubeconfig", kubeconfig).Output()
	if err != nil {
		t.Fatalf("status --hits -o json: %v\n%s", err, out)
	}
	var r hits.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(r.Instances) != 1 || len(r.Instances[0].Nodes) != 1 {
		t.Fatalf("want one instance on one node:\n%s", out)
	}
	i := r.Instances[0]
	n := i.Nodes[0]
	// In time order; the two pods start in either order, within a second
	// or two.
	var got []string
	for i, p := range n.Pulls {
		if i > 0 && p.Time.Before(n.Pulls[i-1].Time) {
			t.Errorf("pull of %s at %s listed after one at %s: want time order", p.Pod, p.Time, n.Pulls[i-1].Time)
		}
		got = append(got, fmt.Sprintf("%s %s hit=%v label=%s", p.Pod, p.Image, p.Hit, p.Label))
	}
	slices.Sort(got)
	want := []string{"apps/hit present:v1 hit=true label=succeeded", "apps/miss ghcr.io/e2e/added:v1 hit=false label=succeeded"}
	if i.Instance != instance || i.Namespace != instance || i.Images != 2 || n.Node != node || n.Label != v1alpha1.LabelSucceeded ||
		i.Counts != (hits.Counts{Hits: 1, Misses: 1}) || n.Counts != i.Counts || strings.Join(got, "; ") != strings.Join(want, "; ") || r.Since == nil {
		t.Errorf("pulls %q, want %q; report:\n%s", got, want, out)
	}

	out, err = c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--hits", "--kubeconfig", kubeconfig).Output()
	if err != nil {
		t.Fatalf("status --hits: %v\n%s", err, out)
	}
	t.Logf("status --hits:\n%s", out)
	table := regexp.MustCompile(`(?m)^hits +\(all\) +- +1 +1 +0\nhits +` + node + ` +succeeded +1 +1 +0\nmiss: hits on ` + node + ` at \S+ \(label succeeded\): pod apps/miss pulled ghcr\.io/e2e/added:v1\nCounted: `)
	if !table.Match(out) {
		t.Errorf("the table does not show one hit and one miss on %s", node)
	}
}

// instanceObjects returns the instance's DaemonSet and list ConfigMap.
func instanceObjects(ctx context.Context, t *testing.T, cs kubernetes.Interface) (*appsv1.DaemonSet, *corev1.ConfigMap) {
	t.Helper()
	l, err := cs.AppsV1().DaemonSets(instance).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + instance})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the instance's DaemonSet: %v (%d)", err, len(l.Items))
	}
	ds := &l.Items[0]
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == v1alpha1.ImageListVolume && v.ConfigMap != nil {
			cm, err := cs.CoreV1().ConfigMaps(instance).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return ds, cm
		}
	}
	t.Fatalf("DaemonSet %s has no volume %s", ds.Name, v1alpha1.ImageListVolume)
	return nil, nil
}

// waitPulled watches the kubelet's Pulled Events of the apps namespace
// until there is one per pod, and returns them.
func waitPulled(ctx context.Context, t *testing.T, cs kubernetes.Interface, want int) map[string]corev1.Event {
	t.Helper()
	sel := "reason=Pulled,source=kubelet"
	got := map[string]corev1.Event{}
	l, err := cs.CoreV1().Events(apps).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range l.Items {
		got[ev.InvolvedObject.Name] = ev
	}
	if len(got) >= want {
		return got
	}
	w, err := cs.CoreV1().Events(apps).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if e, ok := ev.Object.(*corev1.Event); ok {
			got[e.InvolvedObject.Name] = *e
			if len(got) >= want {
				return got
			}
		}
	}
	t.Fatalf("the watch ended with %d Pulled Events of %d: %v", len(got), want, ctx.Err())
	return nil
}

// kubeletWords: the kubelet words its Pulled and Pulling Events as
// recorded, apart from the image, the durations and the size.
func kubeletWords(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	rec, err := recorded.Read()
	if err != nil {
		t.Fatal(err)
	}
	now := map[string]string{}
	for _, reason := range []string{"Pulled", "Pulling"} {
		l, err := cs.CoreV1().Events(apps).List(ctx, metav1.ListOptions{FieldSelector: "source=kubelet,reason=" + reason})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range l.Items {
			now[ev.InvolvedObject.Name+" "+ev.Reason] = ev.Message
		}
	}
	then := map[string]string{}
	for _, ev := range rec.Kubelet {
		if ev.InvolvedObject.Namespace == apps {
			then[ev.InvolvedObject.Name+" "+ev.Reason] = ev.Message
		}
	}
	for _, k := range []string{"hit Pulled", "miss Pulling", "miss Pulled"} {
		if now[k] == "" || mask(now[k]) != mask(then[k]) {
			t.Errorf("%s: the kubelet's message\n%s\nis not as recorded (run with -update if the kubelet changed on purpose):\n%s", k, now[k], then[k])
		}
	}
}

var (
	quoted   = regexp.MustCompile(`"[^"]*"`)
	duration = regexp.MustCompile(`([0-9.]+(ns|µs|ms|h|m|s))+`)
	size     = regexp.MustCompile(`Image size: [0-9]+ bytes`)
)

func mask(msg string) string {
	msg = quoted.ReplaceAllString(msg, `"IMAGE"`)
	msg = size.ReplaceAllString(msg, "Image size: N bytes")
	return duration.ReplaceAllString(msg, "D")
}

// sameEventsBothAPIs: the kubelet writes core/v1 Events (no eventTime,
// which events.k8s.io/v1 requires of what it creates), and
// events.k8s.io/v1 serves the same objects: the view reads core/v1.
func sameEventsBothAPIs(ctx context.Context, t *testing.T, cs kubernetes.Interface, pulled map[string]corev1.Event) {
	l, err := cs.EventsV1().Events(apps).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range []string{"hit", "miss"} {
		core := pulled[pod]
		if !core.EventTime.IsZero() || core.Source.Component != "kubelet" || core.Source.Host != c.Nodes()[0].Name || core.FirstTimestamp.IsZero() {
			t.Errorf("%s: core/v1 Event %+v: want source kubelet on the node, firstTimestamp, no eventTime", pod, core)
		}
		found := false
		for _, ev := range l.Items {
			if ev.Name != core.Name {
				continue
			}
			found = true
			if ev.Note != core.Message || ev.Reason != core.Reason || ev.Regarding.Name != pod || ev.Regarding.FieldPath != core.InvolvedObject.FieldPath ||
				ev.DeprecatedSource.Host != core.Source.Host || !ev.DeprecatedFirstTimestamp.Equal(&core.FirstTimestamp) {
				t.Errorf("%s: events.k8s.io/v1 %+v differs from core/v1 %+v", pod, ev, core)
			}
		}
		if !found {
			t.Errorf("%s: events.k8s.io/v1 does not serve the Event %s", pod, core.Name)
		}
	}
}

// agentCannotList: what the function renders gives the agent no right to
// list Events, anywhere: the view needs the user's own credentials.
func agentCannotList(ctx context.Context, t *testing.T, cs kubernetes.Interface, sa string) {
	for _, ns := range []string{"", instance, apps} {
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + instance + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + instance, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "events", Namespace: ns},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed {
			t.Errorf("the agent's ServiceAccount %s may list Events in %q", sa, ns)
		}
	}
}

// viewer writes a kubeconfig of a user who may read what status --hits
// reads, and nothing more: list nodes, events, daemonsets; get configmaps.
func viewer(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	const name = "hits-viewer"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes", "events"}, Verbs: []string{"list"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: apps}},
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: apps}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(apps).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(apps).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.AuthInfos {
		u.Token = tok.Status.Token
	}
	path := filepath.Join(t.TempDir(), "viewer.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// record writes this run's Events into agent/hits/testdata/recorded.json.
func record(ctx context.Context, t *testing.T, cs kubernetes.Interface, node, ds, list string) {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key := v1alpha1.NodeKey(instance)
	rec := recorded.Recording{Instance: instance, Namespace: instance, DaemonSet: ds, List: list}
	rec.Node.Name = node
	rec.Node.Labels = map[string]string{key: n.Labels[key]}
	rec.Node.Annotations = map[string]string{key: n.Annotations[key]}
	for _, reason := range []string{"Pulled", "Pulling"} {
		l, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "source=kubelet,reason=" + reason})
		if err != nil {
			t.Fatal(err)
		}
		rec.Kubelet = append(rec.Kubelet, l.Items...)
	}
	al, err := cs.CoreV1().Events(instance).List(ctx, metav1.ListOptions{FieldSelector: "source=image-prefetcher"})
	if err != nil {
		t.Fatal(err)
	}
	rec.Agent = al.Items
	if err := recorded.Write(rec); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d kubelet and %d agent Events in %s", len(rec.Kubelet), len(rec.Agent), recorded.Path())
}
