package render

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/agent/taint"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

const startupKey = "startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"

// instanceTree writes a generator-mode kustomization rendering instance
// name in namespace ns (with the startup taint when tainted) and returns
// its directory.
func instanceTree(t *testing.T, ns, name string, tainted bool) string {
	t.Helper()
	dir := copyTree(t, "testdata/kustomize/startup-taint")
	p := filepath.Join(dir, "prefetcher.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(strings.Replace(string(b), "name: demo", "name: "+name, 1), "namespace: prefetch", "namespace: "+ns, 1)
	if !tainted {
		s = s[:strings.Index(s, "  startupTaint:")]
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// above writes a kustomization that includes dir and adds body, and
// returns its directory.
func above(t *testing.T, dir, body string) string {
	t.Helper()
	top := t.TempDir()
	rel, err := filepath.Rel(top, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(top, "kustomization.yaml"), []byte("resources:\n- "+rel+"\n"+body), 0o644); err != nil {
		t.Fatal(err)
	}
	return top
}

// TestFunctionInAComponent (issue 49): the real kustomize runs a
// Component's functions before the includer's patches: and namespace:, so
// a patch of the ImagePrefetcher there was lost and a namespace: there
// moved the agent away from its policy (it exits 5), with only a warning.
// The function cannot see the includer, so it refuses every Component and
// says where to list it instead.
func TestFunctionInAComponent(t *testing.T) {
	comp := run(t, componentTree(t, "comp"), kustomizeBinary(t), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	if comp.err == nil {
		t.Errorf("kustomize build with the function in a Component under namespace: moved exited 0:\n%s", comp.stdout)
	}
	for _, want := range []string{
		"image-prefetcher-fn: error: declared in the kustomize Component ",
		"list the function under transformers: of the kustomization that includes the Component instead",
	} {
		if !strings.Contains(string(comp.stderr), want) {
			t.Errorf("kustomize's stderr does not say %q:\n%s", want, comp.stderr)
		}
	}
}

// componentTree is instance demo in namespace ns, the function declared in
// a kustomize Component that a kustomization with namespace: moved and a
// patch of the ImagePrefetcher includes.
func componentTree(t *testing.T, ns string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"base/kustomization.yaml": "resources:\n- prefetcher.yaml\n",
		"base/prefetcher.yaml": "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: demo\n  namespace: " + ns +
			"\nspec:\n  images:\n  - debian:bookworm\n",
		"component/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\ntransformers:\n- function.yaml\n",
		"component/function.yaml":      "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: image-prefetcher-fn\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: " + fnBinary(t) + "\n",
		"top/kustomization.yaml": "resources:\n- ../base\ncomponents:\n- ../component\nnamespace: moved\npatches:\n- target:\n    kind: ImagePrefetcher\n  patch: |\n" +
			"    - op: replace\n      path: /spec/images/0\n      value: debian:trixie\n",
	}
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(root, "top")
}

// TestIdentityOnAPIServer renders instances with the real kustomize in the
// layerings issue 26 found broken, applies them to one real kube-apiserver,
// and acts as each agent with a token bound to a Pod on node-a:
//
//   - team-a/web with a startup taint and team-b/web without, rendered
//     apart: team-b's policy matched team-a's agent too (the mark named the
//     instance only) and denied its taint removal;
//   - a namePrefix above the function: the Role named the DaemonSet as
//     rendered, and the renamed agent could not read it;
//   - a namespace above the function: not supported; the moved agent is
//     denied every write, with a message that says why.
func TestIdentityOnAPIServer(t *testing.T) {
	builds := map[string][]byte{
		"team-a":  kustomizeBuild(t, instanceTree(t, "team-a", "web", true)),
		"team-b":  kustomizeBuild(t, instanceTree(t, "team-b", "web", false)),
		"renamed": kustomizeBuild(t, above(t, instanceTree(t, "renamed", "demo", true), "namePrefix: x-\n")),
		"moved":   kustomizeBuild(t, above(t, instanceTree(t, "home", "demo", true), "namespace: moved\n")),
	}

	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	other := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	for _, name := range []string{"node-a", "node-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: startupKey, Effect: corev1.TaintEffectNoSchedule}, other}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agents, daemonSets := map[string]*kubernetes.Clientset{}, map[string]string{}
	for _, in := range []struct{ build, ns, sa string }{
		{"team-a", "team-a", "image-prefetcher-web"},
		{"team-b", "team-b", "image-prefetcher-web"},
		{"renamed", "renamed", "x-image-prefetcher-demo"},
		{"moved", "moved", "image-prefetcher-demo"},
	} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: in.ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Apply(ctx, builds[in.build], cluster.ApplyOptions{}); err != nil {
			t.Fatalf("apply %s: %v", in.build, err)
		}
		agents[in.build] = podBoundClient(ctx, t, c, admin, in.ns, in.sa, "node-a")
		daemonSets[in.build] = in.sa
	}
	for _, a := range agents {
		waitForPolicy(ctx, t, a, "node-b")
	}

	removeTaint := func(as string) error {
		n, err := admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		body, err := taint.Patch(n.Spec.Taints, startupKey)
		if err != nil {
			t.Fatal(err)
		}
		_, err = agents[as].CoreV1().Nodes().Patch(ctx, "node-a", types.JSONPatchType, body, metav1.PatchOptions{})
		return err
	}
	retaint := func() {
		b := fmt.Appendf(nil, `{"spec":{"taints":[{"key":%q,"effect":"NoSchedule"},{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]}}`, startupKey)
		if _, err := admin.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ownKey := func(as, ns, name string) error {
		key := "image-prefetcher.stackrox.io/" + name
		ann := fmt.Sprintf(`{"owner":{"namespace":%q,"name":%q,"daemonSet":%q,"id":"x"},"total":1,"present":1,"failed":[]}`, ns, name, daemonSets[as])
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"},"annotations":{%q:%q}}}`, key, key, ann)
		_, err := agents[as].CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	dropKey := func(name string) {
		key := "image-prefetcher.stackrox.io/" + name
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, key, key)
		if _, err := admin.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deniedBy := func(err error, policy, why string) string {
		switch {
		case err == nil:
			return "allowed"
		case !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'") || !strings.Contains(err.Error(), why):
			return fmt.Sprintf("denied, but not by %s for %q: %v", policy, why, err)
		}
		return ""
	}

	t.Run("same name, two namespaces: each policy binds its own agent only", func(t *testing.T) {
		if err := removeTaint("team-a"); err != nil {
			t.Errorf("team-a's agent may not remove its own startup taint: %v", err)
		}
		retaint()
		if got := deniedBy(removeTaint("team-b"), "image-prefetcher.team-b.web", "may not change the node's spec"); got != "" {
			t.Errorf("team-b's agent (no startup taint) removing the taint: %s", got)
		}
	})
	t.Run("namePrefix above the function", func(t *testing.T) {
		if _, err := agents["renamed"].AppsV1().DaemonSets("renamed").Get(ctx, "x-image-prefetcher-demo", metav1.GetOptions{}); err != nil {
			t.Errorf("the renamed agent cannot read its own DaemonSet: %v", err)
		}
		if _, err := agents["renamed"].CoreV1().Pods("renamed").Get(ctx, podOf("x-image-prefetcher-demo"), metav1.GetOptions{}); err != nil {
			t.Errorf("the renamed agent cannot read its own pod: %v", err)
		}
		if err := ownKey("renamed", "renamed", "demo"); err != nil {
			t.Errorf("the renamed agent may not write its key: %v", err)
		}
		dropKey("demo")
		if err := removeTaint("renamed"); err != nil {
			t.Errorf("the renamed agent may not remove its startup taint: %v", err)
		}
		retaint()
		if got := deniedBy(ownKey("renamed", "renamed", "web"), "x-image-prefetcher.renamed.demo", "may only change the label"); got != "" {
			t.Errorf("the renamed agent writing another key: %s", got)
		}
	})
	t.Run("namespace above the function is refused", func(t *testing.T) {
		for _, owner := range []string{"moved", "home"} {
			if got := deniedBy(ownKey("moved", owner, "demo"), "image-prefetcher.home.demo", "rendered for"); got != "" {
				t.Errorf("the moved agent writing its key as %s/demo: %s", owner, got)
			}
		}
		if got := deniedBy(removeTaint("moved"), "image-prefetcher.home.demo", "rendered for"); got != "" {
			t.Errorf("the moved agent removing its taint: %s", got)
		}
	})
}
