package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// The pitfalls docs/integrations.md warns about, each shown with the real
// tool, so that the documentation changes when the tools' behaviour does.

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// `kubectl kustomize` embeds kustomize without exec functions: it refuses
// the function instead of expanding the ImagePrefetcher.
func TestPitfallKubectlKustomize(t *testing.T) {
	tl := findTools(t)
	// The kubectl `make kube` builds, of the cluster's version; else PATH's.
	kubectl := filepath.Join(cluster.DefaultKubeBinDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Fatal("kubectl not found in $KUBE_BIN_DIR or on PATH: run `make kube`")
		}
	}
	tmp := t.TempDir()
	tl.copyTree(t, "kustomize", tmp)
	out, err := tl.runErr(tmp, tl.env(), kubectl, "kustomize", "kustomize/overlays/vanilla")
	if err == nil {
		t.Fatalf("kubectl kustomize rendered the overlay; docs/integrations.md says it cannot run exec functions. Output:\n%s", out)
	}
	if !strings.Contains(err.Error(), "external plugins disabled") {
		t.Errorf("kubectl kustomize failed differently than documented: %v", err)
	}
}

// kpt resolves a relative exec path from the current directory; kustomize
// resolves it from the directory of the kustomization that lists the
// function. A bare name is looked up on PATH by both.
func TestPitfallExecPathResolution(t *testing.T) {
	tl := findTools(t)
	tmp := t.TempDir()
	// tmp/tools/image-prefetcher-fn, and packages next to it that name it
	// relative to themselves: ../tools/image-prefetcher-fn.
	fnCopy := filepath.Join(tmp, "tools", "image-prefetcher-fn")
	data, err := os.ReadFile(tl.fn)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(fnCopy), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fnCopy, data, 0o755); err != nil {
		t.Fatal(err)
	}
	prefetcher := `apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: paths
  namespace: default
spec:
  images: [registry.k8s.io/pause:3.10]
`
	write(t, filepath.Join(tmp, "pkg", "imageprefetcher.yaml"), prefetcher)
	write(t, filepath.Join(tmp, "pkg", "Kptfile"), `apiVersion: kpt.dev/v1
kind: Kptfile
metadata:
  name: pkg
pipeline:
  mutators:
  - exec: ../tools/image-prefetcher-fn
`)
	write(t, filepath.Join(tmp, "kust", "imageprefetcher.yaml"), prefetcher)
	write(t, filepath.Join(tmp, "kust", "function.yaml"), `apiVersion: v1
kind: ConfigMap
metadata:
  name: fn
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: ../tools/image-prefetcher-fn
`)
	write(t, filepath.Join(tmp, "kust", "kustomization.yaml"), "resources: [imageprefetcher.yaml]\ntransformers: [function.yaml]\n")

	// A function declared in a shared directory is resolved from the
	// kustomization that lists it: ../tools from top/ is tmp/tools, while
	// from shared/function/ it would be tmp/shared/tools, which does not exist.
	write(t, filepath.Join(tmp, "intent", "imageprefetcher.yaml"), prefetcher)
	write(t, filepath.Join(tmp, "intent", "kustomization.yaml"), "resources: [imageprefetcher.yaml]\n")
	write(t, filepath.Join(tmp, "shared", "function", "function.yaml"), `apiVersion: v1
kind: ConfigMap
metadata:
  name: fn
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: ../tools/image-prefetcher-fn
`)
	write(t, filepath.Join(tmp, "shared", "function", "kustomization.yaml"), "resources: [function.yaml]\n")
	write(t, filepath.Join(tmp, "top", "kustomization.yaml"), "resources: [../intent]\ntransformers: [../shared/function]\n")

	// An environment without ./bin on PATH: only the relative path can work.
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + tmp}
	for _, tc := range []struct {
		name    string
		dir     string
		argv    []string
		success bool
	}{
		{"kpt from inside the package", filepath.Join(tmp, "pkg"), []string{tl.kpt, "fn", "render", "--allow-exec", ".", "-o", "unwrap"}, true},
		{"kpt from the parent directory", tmp, []string{tl.kpt, "fn", "render", "--allow-exec", "pkg", "-o", "unwrap"}, false},
		{"kustomize from inside the kustomization", filepath.Join(tmp, "kust"), []string{tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "."}, true},
		{"kustomize from the parent directory", tmp, []string{tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "kust"}, true},
		{"kustomize from the root", "/", []string{tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", filepath.Join(tmp, "kust")}, true},
		{"kustomize with a shared function declaration", "/", []string{tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", filepath.Join(tmp, "top")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tl.runErr(tc.dir, env, tc.argv...)
			switch {
			case tc.success && err != nil:
				t.Fatalf("want success: %v", err)
			case !tc.success && err == nil:
				t.Fatalf("want failure (relative path resolved from the current directory), got:\n%s", out)
			case tc.success && !strings.Contains(string(out), "kind: DaemonSet"):
				t.Errorf("no DaemonSet rendered:\n%s", out)
			}
		})
	}
}

// Builtin transformers of a kustomization (namespace, namePrefix, patches,
// images) run before its `transformers:`. namespace and namePrefix must
// therefore sit next to the function, where they reach everything it
// derives; `images:` must sit above it, where the DaemonSet exists.
func TestPitfallBuiltinsRunBeforeTheFunction(t *testing.T) {
	tl := findTools(t)
	tmp := t.TempDir()
	tl.copyTree(t, "kustomize", tmp)
	const mirror = "registry.example.com/mirror/image-prefetcher"
	imagesField := fmt.Sprintf("images:\n- name: ghcr.io/image-prefetcher/image-prefetcher\n  newName: %s\n", mirror)

	// Same kustomization as the function: namespace and namePrefix reach
	// every derived name; images: finds no DaemonSet yet.
	write(t, filepath.Join(tmp, "same", "kustomization.yaml"), "resources: [../kustomize/base]\nnamespace: team-a\nnamePrefix: a-\nlabels:\n- pairs: {team: a}\n"+imagesField+"transformers: [../kustomize/base/function]\n")
	same := decodeObjects(t, tl.run(t, tmp, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "same"))
	ds := only(t, same, "DaemonSet")
	if ds.GetNamespace() != "team-a" || ds.GetName() != "image-prefetcher-a-prefetch" {
		t.Errorf("DaemonSet %s/%s, want team-a/image-prefetcher-a-prefetch (instance a-prefetch)", ds.GetNamespace(), ds.GetName())
	}
	// labels: reach the rendered objects through the ImagePrefetcher, but
	// not the selector.
	if ds.GetLabels()["team"] != "a" {
		t.Errorf("DaemonSet labels %v lack team=a from labels: next to the function", ds.GetLabels())
	}
	if sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "selector", "matchLabels"); sel["team"] != "" {
		t.Errorf("labels: reached the DaemonSet selector %v", sel)
	}
	if got := agentImages(t, ds); strings.Contains(got, mirror) {
		t.Errorf("images: in the function's kustomization changed the agent image to %s; docs say it cannot", got)
	}
	// The policy matches the holder of the instance's marker, and the
	// marker's ClusterRole is bound to the renamed ServiceAccount.
	checkMarkerFollowsServiceAccount(t, same, "team-a/a-prefetch")

	// One level above: images: now finds the DaemonSet.
	write(t, filepath.Join(tmp, "above", "kustomization.yaml"), "resources: [../kustomize/overlays/vanilla]\n"+imagesField)
	above := decodeObjects(t, tl.run(t, tmp, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "above"))
	if got := agentImages(t, only(t, above, "DaemonSet")); !strings.Contains(got, mirror+":") {
		t.Errorf("images: above the function left the agent image at %s", got)
	}
}

// A namePrefix (or namespace) applied ABOVE the kustomization that ran the
// function renames objects after the function derived references from
// their names. kustomize follows the references it knows (RoleBinding and
// ClusterRoleBinding subjects and roleRefs, the policy binding's
// spec.policyName, the ConfigMap volume), but it treats
// SecurityContextConstraints, a kind it has no schema for, as namespaced,
// so the SCC nameReference in kustomize/base cannot match a Role in another
// namespace. This test pins that down, so that docs/integrations.md can say
// plainly: put namePrefix and namespace next to the function.
//
// The admission policy, though, fails closed under such a rename: it
// matches the agent by the marker rule of its ClusterRole, which follows the
// ServiceAccount through the binding, not by a user name kustomize cannot
// see. tests/render/admission_test.go proves it on a real apiserver.
func TestPitfallNamePrefixAboveTheFunction(t *testing.T) {
	tl := findTools(t)
	tmp := t.TempDir()
	tl.copyTree(t, "kustomize", tmp)
	write(t, filepath.Join(tmp, "above", "kustomization.yaml"), "resources: [../kustomize/overlays/ocp]\nnamePrefix: x-\n")
	objs := decodeObjects(t, tl.run(t, tmp, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "above"))

	scc := only(t, objs, "SecurityContextConstraints")
	if scc.GetName() != "x-image-prefetcher.image-prefetcher.prefetch" {
		t.Fatalf("SCC name %q: namePrefix did not rename it", scc.GetName())
	}
	ds := only(t, objs, "DaemonSet")
	required, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "metadata", "annotations", "openshift.io/required-scc")
	if required != "image-prefetcher.image-prefetcher.prefetch" {
		t.Errorf("openshift.io/required-scc is %q, want the name the function rendered", required)
	}
	if required == scc.GetName() {
		t.Errorf("kustomize now follows the SCC rename into openshift.io/required-scc; update docs/integrations.md (namePrefix above the function)")
	}
	sa := only(t, objs, "ServiceAccount")
	if sa.GetName() != "x-image-prefetcher-prefetch" {
		t.Fatalf("ServiceAccount %q was not renamed", sa.GetName())
	}
	// What kustomize does follow.
	for _, o := range objs {
		if o.GetKind() == "RoleBinding" || o.GetKind() == "ClusterRoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				if name := s.(map[string]any)["name"]; name != sa.GetName() {
					t.Errorf("%s %s binds %v, not the renamed ServiceAccount", o.GetKind(), o.GetName(), name)
				}
			}
		}
	}
	// The admission policy keeps matching the renamed agent: the instance
	// (and so the marker name) is unchanged, and the marker's ClusterRole
	// follows the ServiceAccount.
	checkMarkerFollowsServiceAccount(t, objs, "image-prefetcher/prefetch")
	if expr := vapMatch(t, objs); strings.Contains(expr, "userInfo.username") || strings.Contains(expr, "system:serviceaccount:") {
		t.Errorf("the admission policy matches a user name, which a rename above the function leaves behind: %s", expr)
	}
	vap := only(t, objs, "ValidatingAdmissionPolicy")
	if vap.GetName() != "x-image-prefetcher.image-prefetcher.prefetch" {
		t.Errorf("policy %q was not renamed", vap.GetName())
	}
	if name, _, _ := unstructured.NestedString(only(t, objs, "ValidatingAdmissionPolicyBinding").Object, "spec", "policyName"); name != vap.GetName() {
		t.Errorf("the policy binding names %q, not the renamed policy %q: the policy would not be enforced", name, vap.GetName())
	}
}

// checkMarkerFollowsServiceAccount: the policy matches the marker of
// instance (<namespace>/<name> as rendered), and the ClusterRole holding
// that marker is bound, by its current name, to the ServiceAccount's
// current name and namespace.
func checkMarkerFollowsServiceAccount(t *testing.T, objs []*unstructured.Unstructured, instance string) {
	t.Helper()
	marker := "image-prefetcher.stackrox.io/" + instance
	if expr := vapMatch(t, objs); !strings.Contains(expr, "resource('agents').name('"+marker+"').check('label').allowed()") {
		t.Errorf("admission policy matches %q, want the holder of marker %s", expr, marker)
	}
	cr := only(t, objs, "ClusterRole")
	rules, _, _ := unstructured.NestedSlice(cr.Object, "rules")
	hasMarker := false
	for _, r := range rules {
		if fmt.Sprint(r.(map[string]any)["resourceNames"]) == "["+marker+"]" && fmt.Sprint(r.(map[string]any)["resources"]) == "[agents]" {
			hasMarker = true
		}
	}
	if !hasMarker {
		t.Errorf("ClusterRole %s lacks the marker rule for %s: %v", cr.GetName(), marker, rules)
	}
	crb := only(t, objs, "ClusterRoleBinding")
	if ref, _, _ := unstructured.NestedString(crb.Object, "roleRef", "name"); ref != cr.GetName() {
		t.Errorf("ClusterRoleBinding refers to %q, the ClusterRole is %q", ref, cr.GetName())
	}
	sa := only(t, objs, "ServiceAccount")
	subjects, _, _ := unstructured.NestedSlice(crb.Object, "subjects")
	if len(subjects) != 1 || subjects[0].(map[string]any)["name"] != sa.GetName() || subjects[0].(map[string]any)["namespace"] != sa.GetNamespace() {
		t.Errorf("ClusterRoleBinding subjects %v, want the ServiceAccount %s/%s", subjects, sa.GetNamespace(), sa.GetName())
	}
}

func only(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one %s, got %d", kind, len(found))
	}
	return found[0]
}

func agentImages(t *testing.T, ds *unstructured.Unstructured) string {
	t.Helper()
	var images []string
	for _, field := range []string{"initContainers", "containers"} {
		cs, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", field)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			images = append(images, fmt.Sprint(c.(map[string]any)["image"]))
		}
	}
	return strings.Join(images, ",")
}

func vapMatch(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	vap := only(t, objs, "ValidatingAdmissionPolicy")
	conds, _, err := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
	if err != nil || len(conds) == 0 {
		t.Fatalf("admission policy without matchConditions: %v", err)
	}
	var exprs []string
	for _, c := range conds {
		exprs = append(exprs, fmt.Sprint(c.(map[string]any)["expression"]))
	}
	return strings.Join(exprs, " && ")
}

// The SCC nameReference in kustomize/base/scc-namereference.yaml takes
// effect once kustomize knows that SecurityContextConstraints are
// cluster-scoped, which it learns from a cluster OpenAPI document given with
// `openapi: path:`. Here the document comes from the test apiserver, plus
// the SCC path an OpenShift apiserver would list.
func testSCCNameReferenceWithClusterSchema(t *testing.T, tl tools, api *apiServer) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := api.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/openapi/v2").DoRaw(ctx)
	if err != nil {
		t.Fatalf("fetch /openapi/v2: %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	doc["paths"].(map[string]any)["/apis/security.openshift.io/v1/securitycontextconstraints/{name}"] = map[string]any{
		"get": map[string]any{"x-kubernetes-group-version-kind": map[string]any{"group": sccGroup, "version": "v1", "kind": "SecurityContextConstraints"}},
	}
	schema, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	tl.copyTree(t, "kustomize", tmp)
	write(t, filepath.Join(tmp, "above", "openapi.json"), string(schema))
	// A strategic-merge patch on the rendered DaemonSet checks that the
	// document still carries the built-in types' merge keys.
	write(t, filepath.Join(tmp, "above", "kustomization.yaml"), `resources: [../kustomize/overlays/ocp]
namePrefix: x-
openapi:
  path: openapi.json
patches:
- patch: |
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: image-prefetcher-prefetch
      namespace: image-prefetcher
    spec:
      template:
        spec:
          containers:
          - name: watch
            env:
            - name: GODEBUG
              value: madvdontneed=1
`)
	out := tl.run(t, tmp, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "above")
	checkOpenShiftWiring(t, out)
	objs := decodeObjects(t, out)
	if scc := only(t, objs, "SecurityContextConstraints"); scc.GetName() != "x-image-prefetcher.image-prefetcher.prefetch" {
		t.Errorf("SCC %q was not renamed", scc.GetName())
	}
	env, _, _ := unstructured.NestedSlice(only(t, objs, "DaemonSet").Object, "spec", "template", "spec", "containers")
	if got := fmt.Sprint(env); !strings.Contains(got, "GODEBUG") || !strings.Contains(got, "NODE_NAME") {
		t.Errorf("the patch replaced the container's env instead of merging it: %s", got)
	}
}

// The overlay docs/integrations.md shows under "Your own overlay", built
// with its remote references pointed at a local copy of kustomize/.
func testDocsOwnOverlay(t *testing.T, tl tools, api *apiServer) {
	doc, err := os.ReadFile(filepath.Join(tl.root, "docs/integrations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Your own overlay")
	if !ok {
		t.Fatal(`docs/integrations.md has no "### Your own overlay" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("no yaml block in the section")
	}
	block, _, _ = strings.Cut(block, "```")
	const remote = "https://github.com/image-prefetcher/image-prefetcher//"
	ref := "?ref=v" + readVersion(t, tl)
	if strings.Count(block, remote) != 2 || strings.Count(block, ref) != 2 {
		t.Fatalf("want the base and the function as remote references at %s:\n%s", ref, block)
	}
	local := strings.ReplaceAll(strings.ReplaceAll(block, remote, "../"), ref, "")
	tmp := t.TempDir()
	tl.copyTree(t, "kustomize", tmp)
	write(t, filepath.Join(tmp, "mine", "kustomization.yaml"), local)
	out := tl.run(t, tmp, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "mine")
	api.dryRunApply(t, out)
	objs := decodeObjects(t, out)
	ds := only(t, objs, "DaemonSet")
	if ds.GetNamespace() != "prefetch" {
		t.Errorf("DaemonSet in namespace %q, want prefetch", ds.GetNamespace())
	}
	if got := agentImages(t, ds); !strings.Contains(got, "registry.example.com/mirror/image-prefetcher:") {
		t.Errorf("agent image %s, want the mirror set through spec.agent.image", got)
	}
	cm := only(t, objs, "ConfigMap")
	list, _, _ := unstructured.NestedString(cm.Object, "data", "images.txt")
	if !strings.Contains(list, "registry.example.com/team/api:2.4.1") || strings.Contains(list, "pause") {
		t.Errorf("image list %q, want the patched list only", list)
	}
}

// examples/image-list-file/README.md quotes the error a bad line produces;
// this reproduces it with the lines the quote names.
func TestImageListFileErrorIsAsDocumented(t *testing.T) {
	tl := findTools(t)
	readme, err := os.ReadFile(filepath.Join(tl.root, "examples/image-list-file/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var quoted string
	for _, line := range strings.Split(string(readme), "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "image-prefetcher-fn: error:") {
			quoted = l
		}
	}
	if quoted == "" {
		t.Fatal("the README quotes no error line")
	}
	dir := tl.copyTree(t, "examples/image-list-file", t.TempDir())
	list := filepath.Join(dir, "images.txt")
	data, err := os.ReadFile(list)
	if err != nil {
		t.Fatal(err)
	}
	// The quoted error is about line 15: a duplicate on 14, a bad line on 15.
	data = append(data, []byte("docker.io/library/busybox:1.37\nnot a valid//ref\n")...)
	if n := strings.Count(string(data), "\n"); n != 15 {
		t.Fatalf("images.txt now has %d lines; the README's example assumes 15", n)
	}
	if err := os.WriteFile(list, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = tl.runErr(dir, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", ".")
	if err == nil {
		t.Fatal("a bad line did not fail the render")
	}
	if !strings.Contains(err.Error(), quoted) {
		t.Errorf("stderr does not contain the README's line\n  %s\ngot: %v", quoted, err)
	}
}
