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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

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
		cc := rest.CopyConfig(cfg)
		cc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:prefetch:image-prefetcher-demo"}
		if node != "" {
			cc.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
		}
		cs, err := kubernetes.NewForConfig(cc)
		if err != nil {
			t.Fatal(err)
		}
		return cs
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
	cases := []struct {
		name    string
		as      string
		node    string
		patch   string
		allowed bool
	}{
		{"own label and annotation", "node-a", "node-a", fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"},"annotations":{%q:"{\"total\":1}"}}}`, key, key), true},
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
	// The apiserver loads new policies asynchronously: wait until the
	// policy denies a patch it must deny. No controller-manager runs here,
	// so the policy's status.typeChecking is never written; the allowed
	// cases below prove that every expression compiles and evaluates.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := agentOn("node-a").CoreV1().Nodes().Patch(ctx, "node-b", types.MergePatchType, []byte(`{"metadata":{"labels":{"pool":"w"}}}`), metav1.PatchOptions{})
		if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy was not enforced within a minute; last result: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
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
}
