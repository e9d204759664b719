package render

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// TestAdmissionPolicyOnAPIServer applies the rendered RBAC and admission
// policy to a real kube-apiserver (control plane only) and patches Nodes
// as the agent's ServiceAccount, with and without the node-name extra that
// pod-bound tokens carry. Only the agent's own label and annotation on its
// own node may change.
func TestAdmissionPolicyOnAPIServer(t *testing.T) {
	dir := copyTree(t, "testdata/kustomize/generator")
	manifests := kustomizeBuild(t, dir)

	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prefetch"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The pull secret the rendered DaemonSet mounts is not needed here.
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply rendered output: %v", err)
	}
	for _, name := range []string{"node-a", "node-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "x"}, Annotations: map[string]string{"other": "y"}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	cfg, err := c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	agentOn := func(node string) *kubernetes.Clientset {
		return impersonate(t, cfg, "system:serviceaccount:prefetch:image-prefetcher-demo", node)
	}
	// Every other rendered output is valid for the apiserver too, apart from
	// OpenShift's SecurityContextConstraints, a kind it does not know.
	for _, ns := range []string{"dev", "prod"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, golden := range []string{"overlay-dev", "overlay-prod"} {
		b, err := os.ReadFile("testdata/kustomize/" + golden + ".golden.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var docs []string
		for _, doc := range strings.Split(string(b), "\n---\n") {
			if !strings.Contains(doc, "kind: SecurityContextConstraints") {
				docs = append(docs, doc)
			}
		}
		if _, err := c.Apply(ctx, []byte(strings.Join(docs, "\n---\n")), cluster.ApplyOptions{DryRun: true}); err != nil {
			t.Errorf("dry-run apply of %s: %v", golden, err)
		}
	}

	// So is every golden render of the function's own tests, which covers
	// every field (affinity, tolerations, credential provider, pull
	// secrets, resources, priority class, Lease RBAC, ocp pod settings).
	goldens, err := filepath.Glob("../../fn/cmd/image-prefetcher-fn/testdata/render/*.out.yaml")
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no function goldens found: %v", err)
	}
	for _, file := range goldens {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rl, err := fn.ParseResourceList(b)
		if err != nil {
			t.Fatal(err)
		}
		var docs []string
		for _, it := range rl.Items {
			if it.GetLabel("app.kubernetes.io/managed-by") != "image-prefetcher-fn" || it.GetKind() == "SecurityContextConstraints" {
				continue
			}
			// The prometheus-operator's kinds are not served here: they are
			// decoded strictly into the operator's own types instead.
			if strings.HasPrefix(it.GetAPIVersion(), "monitoring.coreos.com/") {
				strictMonitoring(t, filepath.Base(file), it.GetKind(), []byte(it.String()))
				continue
			}
			if ns := it.GetNamespace(); ns != "" {
				_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
			}
			docs = append(docs, it.String())
		}
		if _, err := c.Apply(ctx, []byte(strings.Join(docs, "---\n")), cluster.ApplyOptions{DryRun: true}); err != nil {
			t.Errorf("dry-run apply of %s: %v", filepath.Base(file), err)
		}
	}

	const key = "image-prefetcher.stackrox.io/demo"
	// The annotation as the agent writes it: its owner first (see
	// agent/label's Owner), the namespace the ServiceAccount's.
	owned := func(ns string) string {
		return fmt.Sprintf(`{"owner":{"namespace":%q,"name":"demo","daemonSet":"image-prefetcher-demo","id":"x"},"total":1}`, ns)
	}
	withAnnotation := func(ann string) string {
		return fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"},"annotations":{%q:%q}}}`, key, key, ann)
	}
	cases := []struct {
		name    string
		as      string
		node    string
		patch   string
		allowed bool
	}{
		{"own label and annotation", "node-a", "node-a", withAnnotation(owned("prefetch")), true},
		{"an annotation without an owner", "node-a", "node-a", withAnnotation(`{"total":1}`), false},
		{"an annotation naming another namespace", "node-a", "node-a", withAnnotation(owned("other")), false},
		{"an annotation naming another copy of the instance", "node-a", "node-a", withAnnotation(strings.Replace(owned("prefetch"), `"image-prefetcher-demo"`, `"b-image-prefetcher-demo"`, 1)), false},
		{"an annotation of an earlier release, without the DaemonSet", "node-a", "node-a", withAnnotation(strings.Replace(owned("prefetch"), `"daemonSet":"image-prefetcher-demo",`, "", 1)), false},
		{"an annotation naming two owners", "node-a", "node-a", withAnnotation(strings.TrimSuffix(owned("prefetch"), "}") + `,"owner":{"namespace":"other","name":"demo","id":"y"}}`), false},
		{"label to failed", "node-a", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:"failed"}}}`, key), true},
		{"remove both", "node-a", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, key, key), true},
		{"label value outside the set", "node-a", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:"maybe"}}}`, key), false},
		{"another label", "node-a", "node-a", `{"metadata":{"labels":{"pool":"z"}}}`, false},
		{"add a foreign label", "node-a", "node-a", `{"metadata":{"labels":{"image-prefetcher.stackrox.io/other":"succeeded"}}}`, false},
		{"another annotation", "node-a", "node-a", `{"metadata":{"annotations":{"other":null}}}`, false},
		{"spec", "node-a", "node-a", `{"spec":{"unschedulable":true}}`, false},
		{"another node", "node-a", "node-b", fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"}}}`, key), false},
		{"no node-name extra", "", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"}}}`, key), false},
	}
	waitForPolicy(ctx, t, agentOn("node-a"), "node-b")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := agentOn(tc.as).CoreV1().Nodes().Patch(ctx, tc.node, types.MergePatchType, []byte(tc.patch), metav1.PatchOptions{})
			switch {
			case tc.allowed && err != nil:
				t.Errorf("denied: %v", err)
			case !tc.allowed && err == nil:
				t.Errorf("allowed")
			case !tc.allowed && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
				t.Errorf("denied, but not by the policy: %v", err)
			}
		})
	}

	// The policy matches the agent by the marker rule of its ClusterRole;
	// a principal whose grant covers every name of the marker resource
	// (here the test's admin, in system:masters) is not the agent and must
	// keep changing Nodes freely.
	t.Run("cluster admin is not restricted", func(t *testing.T) {
		if _, err := admin.CoreV1().Nodes().Patch(ctx, "node-b", types.MergePatchType, []byte(`{"metadata":{"labels":{"pool":"admin"}},"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("denied: %v", err)
		}
	})
}

// TestAdmissionPolicyFollowsRenames: a namePrefix applied with the real
// kustomize ABOVE the kustomization that ran the function renames the
// ServiceAccount, the ClusterRole and its binding, and the policy and its
// binding after the function computed every name. The policy matches the
// agent by the marker rule of its ClusterRole, which kustomize's built-in
// nameReferences carry along (roleRef, subjects, spec.policyName), so the
// renamed agent stays restricted: it fails closed. (A namespace above the
// function is refused: TestIdentityOnAPIServer.)
func TestAdmissionPolicyFollowsRenames(t *testing.T) {
	gen := copyTree(t, "testdata/kustomize/generator")
	above := t.TempDir()
	rel, err := filepath.Rel(above, gen)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(above, "kustomization.yaml"), []byte("resources:\n- "+rel+"\nnamePrefix: x-\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	manifests := kustomizeBuild(t, above)

	const (
		policy = "x-image-prefetcher.prefetch.demo"
		user   = "system:serviceaccount:prefetch:x-image-prefetcher-demo"
		key    = "image-prefetcher.stackrox.io/demo"
	)
	// What kustomize must have followed for the policy to bite.
	objs := map[string]*unstructured.Unstructured{}
	docs, err := decodeDocs(manifests)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range docs {
		objs[o.GetKind()] = o
	}
	if sa := objs["ServiceAccount"]; sa == nil || sa.GetNamespace()+"/"+sa.GetName() != "prefetch/x-image-prefetcher-demo" {
		t.Fatalf("the ServiceAccount was not renamed to prefetch/x-image-prefetcher-demo:\n%s", manifests)
	}
	crb := objs["ClusterRoleBinding"]
	if ref, _, _ := unstructured.NestedString(crb.Object, "roleRef", "name"); ref != objs["ClusterRole"].GetName() {
		t.Errorf("ClusterRoleBinding roleRef %q, ClusterRole %q", ref, objs["ClusterRole"].GetName())
	}
	subjects, _, _ := unstructured.NestedSlice(crb.Object, "subjects")
	if len(subjects) != 1 || fmt.Sprint(subjects[0].(map[string]any)["namespace"], "/", subjects[0].(map[string]any)["name"]) != "prefetch/x-image-prefetcher-demo" {
		t.Errorf("ClusterRoleBinding subjects %v, want the renamed ServiceAccount", subjects)
	}
	if got := objs["ValidatingAdmissionPolicy"].GetName(); got != policy {
		t.Errorf("policy %q, want %q", got, policy)
	}
	if got, _, _ := unstructured.NestedString(objs["ValidatingAdmissionPolicyBinding"].Object, "spec", "policyName"); got != policy {
		t.Errorf("the policy binding names %q, not the renamed policy %q: kustomize no longer follows spec.policyName", got, policy)
	}

	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prefetch"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply renamed output: %v", err)
	}
	for _, name := range []string{"node-a", "node-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "x"}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	agent := impersonate(t, cfg, user, "node-a")
	waitForPolicy(ctx, t, agent, "node-b")
	for _, tc := range []struct {
		name    string
		node    string
		patch   string
		allowed bool
	}{
		// The owner is the instance as rendered, which a namePrefix does
		// not rename.
		{"own label", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"},"annotations":{%q:"{\"owner\":{\"namespace\":\"prefetch\",\"name\":\"demo\",\"daemonSet\":\"image-prefetcher-demo\",\"id\":\"x\"}}"}}}`, key, key), true},
		{"owned by another namespace", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:"failed"},"annotations":{%q:"{\"owner\":{\"namespace\":\"other\",\"name\":\"demo\",\"daemonSet\":\"image-prefetcher-demo\",\"id\":\"x\"}}"}}}`, key, key), false},
		{"another label", "node-a", `{"metadata":{"labels":{"pool":"z"}}}`, false},
		{"another node", "node-b", fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"}}}`, key), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := agent.CoreV1().Nodes().Patch(ctx, tc.node, types.MergePatchType, []byte(tc.patch), metav1.PatchOptions{})
			switch {
			case tc.allowed && err != nil:
				t.Errorf("denied: %v", err)
			case !tc.allowed && err == nil:
				t.Errorf("allowed: the renamed agent escapes the policy")
			case !tc.allowed && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'"):
				t.Errorf("denied, but not by the renamed policy: %v", err)
			}
		})
	}
}

// impersonate is a client acting as user, with the node-name and pod-name
// extras of a pod-bound token when node is set.
func impersonate(t *testing.T, cfg *rest.Config, user, node string) *kubernetes.Clientset {
	t.Helper()
	cc := rest.CopyConfig(cfg)
	cc.Impersonate = rest.ImpersonationConfig{UserName: user}
	if node != "" {
		cc.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}, "authentication.kubernetes.io/pod-name": {agentPod}}
	}
	cs, err := kubernetes.NewForConfig(cc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// waitForPolicy waits until the policy denies a patch it must deny: the
// apiserver loads new policies asynchronously. No controller-manager runs
// here, so the policy's status.typeChecking is never written; the allowed
// cases prove that every expression compiles and evaluates.
func waitForPolicy(ctx context.Context, t *testing.T, agent *kubernetes.Clientset, otherNode string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := agent.CoreV1().Nodes().Patch(ctx, otherNode, types.MergePatchType, []byte(`{"metadata":{"labels":{"pool":"w"}}}`), metav1.PatchOptions{})
		if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy was not enforced within a minute; last result: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func decodeDocs(b []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var o unstructured.Unstructured
		if err := sigsyaml.Unmarshal([]byte(doc), &o.Object); err != nil {
			return nil, err
		}
		if o.Object != nil {
			out = append(out, &o)
		}
	}
	return out, nil
}
