package render

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// TestAdmissionPolicyOwnership: two instances named demo, in team-a and
// team-b, each rendered by the function on its own (one ResourceList would
// refuse them), applied to one real kube-apiserver. Both agents patch
// node-a with the pod-bound tokens of real Pods on that node. The key
// image-prefetcher.stackrox.io/demo is theirs to share, so the owner in its
// annotation decides: once team-a owns it, team-b may neither write nor
// remove it, nor claim it in team-a's name; once team-a removed it, it is
// free again. A key without an owner is adopted in one write, and so is
// team-a's key as an earlier release wrote it, without the DaemonSet.
func TestAdmissionPolicyOwnership(t *testing.T) {
	const key = "image-prefetcher.stackrox.io/demo"
	var manifests [][]byte
	for _, ns := range []string{"team-a", "team-b"} {
		dir := copyTree(t, "testdata/kustomize/generator")
		p := filepath.Join(dir, "prefetcher.yaml")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Replace(b, []byte("namespace: prefetch"), []byte("namespace: "+ns), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		manifests = append(manifests, kustomizeBuild(t, dir))
	}

	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node-a", "node-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agents := map[string]*kubernetes.Clientset{}
	for i, ns := range []string{"team-a", "team-b"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Apply(ctx, manifests[i], cluster.ApplyOptions{}); err != nil {
			t.Fatalf("apply %s: %v", ns, err)
		}
		agents[ns] = podBoundClient(ctx, t, c, admin, ns, "image-prefetcher-demo", "node-a")
	}
	for _, a := range agents {
		waitForPolicy(ctx, t, a, "node-b")
	}

	owned := func(ns string) string {
		return fmt.Sprintf(`{"owner":{"namespace":%q,"name":"demo","daemonSet":"image-prefetcher-demo","id":"x"},"total":1,"present":1,"failed":[]}`, ns)
	}
	write := func(value, ann string) string {
		return fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}}}`, key, value, key, ann)
	}
	legacy := strings.Replace(owned("team-a"), `"daemonSet":"image-prefetcher-demo",`, "", 1)
	remove := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, key, key)
	steps := []struct {
		name    string
		as      string // "" is the cluster admin
		patch   string
		allowed bool
		// wantDenial is part of the policy's message for a denial.
		wantDenial string
	}{
		{"team-a writes its key", "team-a", write("failed", owned("team-a")), true, ""},
		{"team-b overwrites it", "team-b", write("succeeded", owned("team-b")), false, "belongs to another instance"},
		{"team-b changes the label alone", "team-b", fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"}}}`, key), false, "belongs to another instance"},
		{"team-b claims it in team-a's name", "team-b", write("succeeded", owned("team-a")), false, "belongs to another instance"},
		{"team-b removes it", "team-b", remove, false, "belongs to another instance"},
		{"team-a updates its key", "team-a", write("succeeded", owned("team-a")), true, ""},
		{"team-a removes its key", "team-a", remove, true, ""},
		{"team-b writes the free key", "team-b", write("succeeded", owned("team-b")), true, ""},
		{"team-a may not take it", "team-a", write("failed", owned("team-a")), false, "belongs to another instance"},
		{"team-b removes its key", "team-b", remove, true, ""},
		{"an earlier release left a key without owner", "", write("succeeded", `{"total":1,"present":1,"failed":[]}`), true, ""},
		{"team-a cannot keep it ownerless", "team-a", write("failed", `{"total":1,"present":0,"failed":[]}`), false, "only with an annotation that names its instance team-a/demo"},
		{"team-a adopts it in one write", "team-a", write("succeeded", owned("team-a")), true, ""},
		{"team-b cannot adopt it any more", "team-b", write("succeeded", owned("team-b")), false, "belongs to another instance"},
		{"an earlier release of team-a left its owner without the DaemonSet", "", write("failed", legacy), true, ""},
		{"team-b may not take team-a's", "team-b", write("succeeded", owned("team-b")), false, "belongs to another instance"},
		{"team-a rewrites it with its DaemonSet", "team-a", write("succeeded", owned("team-a")), true, ""},
	}
	for _, st := range steps {
		client := admin
		if st.as != "" {
			client = agents[st.as]
		}
		_, err := client.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(st.patch), metav1.PatchOptions{})
		switch {
		case st.allowed && err != nil:
			t.Fatalf("%s: denied: %v", st.name, err)
		case !st.allowed && err == nil:
			t.Fatalf("%s: allowed", st.name)
		case !st.allowed && (!strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), st.wantDenial)):
			t.Errorf("%s: denied, but not for owning: %v", st.name, err)
		}
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[key] != "succeeded" || n.Annotations[key] != owned("team-a") {
		t.Errorf("node-a ends with %q %q, want team-a's key", n.Labels[key], n.Annotations[key])
	}
}

// agentPod is the name of the agent's Pod in these tests, as the DaemonSet
// controller names the pods of DaemonSet image-prefetcher-demo: the
// admission policy reads the DaemonSet, the owner records' "daemonSet",
// from it (the name without its last 6 characters).
const agentPod = "image-prefetcher-demo-x7k2q"

// podOf names a pod of the DaemonSet that has the ServiceAccount's name, as
// the rendered ones do (also under a namePrefix).
func podOf(sa string) string { return sa + "-x7k2q" }

// podBoundClient creates a Pod (podOf) of the ServiceAccount on node (no kubelet
// runs it; the API object is what a token is bound to) and returns a
// client with a token bound to that Pod, as the kubelet would project it.
// Such a token carries the node's name, which the policy requires.
func podBoundClient(ctx context.Context, t *testing.T, c *cluster.Cluster, admin *kubernetes.Clientset, ns, sa, node string) *kubernetes.Clientset {
	t.Helper()
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podOf(sa), Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "watch", Image: "example.com/agent:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := c.PodClient(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	if want := "system:serviceaccount:" + ns + ":" + sa; u.Username != want || len(u.Extra["authentication.kubernetes.io/node-name"]) != 1 || u.Extra["authentication.kubernetes.io/node-name"][0] != node {
		t.Fatalf("the pod-bound token authenticates as %s %v, want %s with node-name %s", u.Username, u.Extra, want, node)
	}
	return client
}
