package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// fnBinary is the function built once for the in-process kustomize tests,
// which run it as an exec function like `kustomize build --enable-exec`.
var fnBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "image-prefetcher-fn-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fnBinary = filepath.Join(dir, "image-prefetcher-fn")
	build := exec.Command("go", "build", "-o", fnBinary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build the function for the kustomize tests: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// kustomize builds dir in-process with exec functions enabled.
func kustomize(t *testing.T, dir string) resmap.ResMap {
	t.Helper()
	opts := krusty.MakeDefaultOptions()
	opts.PluginConfig = types.EnabledPluginConfig(types.BploUseStaticallyLinked)
	opts.PluginConfig.FnpLoadingOptions.EnableExec = true
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return m
}

// writeTree writes files (path -> content) under a new temporary directory;
// "FN" in a content is replaced by the path of the built function.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(strings.ReplaceAll(content, "FN", fnBinary)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func find(t *testing.T, m resmap.ResMap, kind, name string) *yaml.RNode {
	t.Helper()
	var names []string
	for _, r := range m.Resources() {
		if r.GetKind() == kind && (name == "" || r.GetName() == name) {
			return r.RNode.Copy()
		}
		names = append(names, r.GetKind()+"/"+r.GetName())
	}
	t.Fatalf("no %s %q in the output; have %v", kind, name, names)
	return nil
}

func field(t *testing.T, n *yaml.RNode, path ...string) string {
	t.Helper()
	v, err := n.Pipe(yaml.Lookup(path...))
	if err != nil || v == nil {
		t.Fatalf("%s %s: no field %v", n.GetKind(), n.GetName(), path)
	}
	return strings.TrimSpace(v.MustString())
}

const fnTransformer = `apiVersion: v1
kind: ConfigMap
metadata:
  name: image-prefetcher-fn
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: FN
`

// base is the base-plus-overlays layout: the base holds the intent, the
// overlays patch it and run the function last, as a transformer.
var base = map[string]string{
	"base/kustomization.yaml": `resources:
- prefetcher.yaml
configMapGenerator:
- name: images
  files:
  - images.txt
`,
	"base/prefetcher.yaml": `apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: demo
  namespace: base-ns
spec:
  imageListFrom:
    configMapRef:
      name: images
      key: images.txt
`,
	"base/images.txt": "# platform\ndebian:bookworm\nquay.io/prometheus/busybox:latest\n",
}

func overlay(name, body string) map[string]string {
	return map[string]string{
		name + "/kustomization.yaml": "resources:\n- ../base\ntransformers:\n- fn.yaml\n" + body,
		name + "/fn.yaml":            fnTransformer,
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func TestKustomizeOverlayNamePrefixNamespacePatch(t *testing.T) {
	root := writeTree(t, merge(base, overlay("dev", `namePrefix: dev-
namespace: dev
labels:
- pairs:
    team: platform
patches:
- target:
    kind: ImagePrefetcher
    name: demo
  patch: |
    apiVersion: image-prefetcher.stackrox.io/v1alpha1
    kind: ImagePrefetcher
    metadata:
      name: demo
    spec:
      images:
      - registry.k8s.io/pause:3.10
      pull:
        parallelism: 8
        maxConcurrentNodes: 2
`)))
	m := kustomize(t, filepath.Join(root, "dev"))

	ds := find(t, m, "DaemonSet", "image-prefetcher-dev-demo")
	if ns := ds.GetNamespace(); ns != "dev" {
		t.Errorf("DaemonSet namespace %q, want dev", ns)
	}
	args := field(t, ds, "spec", "template", "spec", "containers", "[name=watch]", "args")
	for _, want := range []string{"--parallelism=8", "--max-concurrent-nodes=2"} {
		if !strings.Contains(args, want) {
			t.Errorf("watch args lack %s:\n%s", want, args)
		}
	}
	if env := field(t, ds, "spec", "template", "spec", "containers", "[name=watch]", "env", "[name=INSTANCE_NAME]", "value"); env != "dev-demo" {
		t.Errorf("INSTANCE_NAME %q, want dev-demo", env)
	}
	if l := ds.GetLabels()["team"]; l != "platform" {
		t.Errorf("overlay label team=%q on the DaemonSet, want platform", l)
	}
	// The list combines the patched inline image and the generated
	// ConfigMap, found under its original name after namePrefix; a comment
	// line names each source.
	cm := find(t, m, "ConfigMap", "image-prefetcher-dev-demo.images")
	if got, want := cm.GetDataMap()["images.txt"], "# spec.images\nregistry.k8s.io/pause:3.10\n# ConfigMap dev/images key \"images.txt\"\ndebian:bookworm\nquay.io/prometheus/busybox:latest\n"; got != want {
		t.Errorf("images.txt:\n%s\nwant\n%s", got, want)
	}
	if _, ok := cm.GetAnnotations()["kustomize.config.k8s.io/needs-hash"]; ok {
		t.Error("needs-hash leaked into transformer output")
	}
	vap := find(t, m, "ValidatingAdmissionPolicy", "image-prefetcher.dev.dev-demo")
	// The policy matches whoever holds the instance's marker; the
	// ClusterRole holding it is bound to the overlay's ServiceAccount.
	if got := field(t, vap, "spec", "matchConditions", "[name=is-image-prefetcher-agent]", "expression"); !strings.Contains(got, ".name('image-prefetcher.stackrox.io/dev/dev-demo').check('label')") {
		t.Errorf("policy does not match the prefixed instance's marker: %s", got)
	}
	cr := find(t, m, "ClusterRole", "image-prefetcher.dev.dev-demo")
	if rules := cr.MustString(); !strings.Contains(rules, "- image-prefetcher.stackrox.io/dev/dev-demo\n") {
		t.Errorf("ClusterRole lacks the marker of instance dev/dev-demo:\n%s", rules)
	}
	crb := find(t, m, "ClusterRoleBinding", "image-prefetcher.dev.dev-demo")
	if got := field(t, crb, "subjects", "[name=image-prefetcher-dev-demo]", "namespace"); got != "dev" {
		t.Errorf("the marker's ClusterRole is not bound to dev/image-prefetcher-dev-demo:\n%s", crb.MustString())
	}
	if !strings.Contains(field(t, vap, "spec", "variables", "[name=key]", "expression"), "image-prefetcher.stackrox.io/dev-demo") {
		t.Error("policy key is not the prefixed instance name")
	}
	leases := find(t, m, "ValidatingAdmissionPolicy", "image-prefetcher.dev.dev-demo.leases")
	if got := leases.MustString(); !strings.Contains(got, "'dev-demo-slot-1'") || strings.Contains(got, "dev-demo-slot-2") ||
		!strings.Contains(got, "'dev-demo-wait-'") {
		t.Errorf("lease names do not follow the prefixed instance and maxConcurrentNodes=2:\n%s", got)
	}
	for _, r := range m.Resources() {
		if r.GetKind() == "ImagePrefetcher" {
			t.Error("the ImagePrefetcher was not replaced by its expansion")
		}
		for k := range r.GetAnnotations() {
			if strings.HasPrefix(k, "config.kubernetes.io/") || strings.HasPrefix(k, "internal.config.kubernetes.io/") {
				t.Errorf("%s %s carries %s", r.GetKind(), r.GetName(), k)
			}
		}
	}
}

// Two overlays of one base, with the same instance name in two namespaces,
// in one build: no object collides.
func TestKustomizeTwoInstancesDoNotCollide(t *testing.T) {
	root := writeTree(t, merge(base,
		overlay("a", "namespace: team-a\n"),
		overlay("b", "namespace: team-b\n"),
		map[string]string{"all/kustomization.yaml": "resources:\n- ../a\n- ../b\n"}))
	m := kustomize(t, filepath.Join(root, "all"))
	for _, ns := range []string{"team-a", "team-b"} {
		find(t, m, "ClusterRole", "image-prefetcher."+ns+".demo")
		find(t, m, "ValidatingAdmissionPolicy", "image-prefetcher."+ns+".demo")
	}
	count := 0
	for _, r := range m.Resources() {
		if r.GetKind() == "DaemonSet" {
			count++
		}
	}
	if count != 2 {
		t.Errorf("%d DaemonSets, want 2", count)
	}
}

// The pod-template hash follows the list: two overlays that differ only in
// one image roll differently.
func TestKustomizeListChangeRollsDaemonSet(t *testing.T) {
	root := writeTree(t, merge(base,
		overlay("one", ""),
		overlay("two", `patches:
- target:
    kind: ImagePrefetcher
  patch: |
    - op: add
      path: /spec/images
      value: [alpine:3.20]
`)))
	hash := func(dir string) string {
		ds := find(t, kustomize(t, filepath.Join(root, dir)), "DaemonSet", "")
		return field(t, ds, "spec", "template", "metadata", "annotations", "image-prefetcher.stackrox.io/config-hash")
	}
	if a, b := hash("one"), hash("two"); a == b {
		t.Errorf("same config-hash %s for different lists", a)
	}
}

// Generator mode: kustomize hashes the ConfigMap name and rewrites the
// DaemonSet's volume to it.
func TestKustomizeGenerator(t *testing.T) {
	root := writeTree(t, map[string]string{
		"kustomization.yaml": "generators:\n- prefetcher.yaml\n",
		"prefetcher.yaml": `apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: demo
  namespace: prefetch
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: FN
spec:
  images: [debian:bookworm]
`,
	})
	m := kustomize(t, root)
	var cmName string
	for _, r := range m.Resources() {
		if r.GetKind() == "ConfigMap" {
			cmName = r.GetName()
			if _, ok := r.GetAnnotations()["kustomize.config.k8s.io/needs-hash"]; ok {
				t.Error("needs-hash annotation left in the output")
			}
		}
		if r.GetKind() == "ImagePrefetcher" {
			t.Error("the generator's config is in the output")
		}
	}
	if !strings.HasPrefix(cmName, "image-prefetcher-demo.images-") {
		t.Fatalf("ConfigMap %q has no hash suffix", cmName)
	}
	ds := find(t, m, "DaemonSet", "image-prefetcher-demo")
	if got := field(t, ds, "spec", "template", "spec", "volumes", "[name=image-list]", "configMap", "name"); got != cmName {
		t.Errorf("DaemonSet mounts ConfigMap %q, want %q", got, cmName)
	}
	// The agent finds its own DaemonSet through its pod's owner reference:
	// the get on pods and daemonsets names no object, so that no rename
	// (kustomize's of a ConfigMap's hashed name, a namePrefix after the
	// function) leaves it stale.
	if got := ownDaemonSetGrant(t, find(t, m, "Role", "image-prefetcher-demo")); got != "" {
		t.Errorf("the Role's get on daemonsets is limited to %q: it goes stale when kustomize renames the DaemonSet", got)
	}
}

// ownDaemonSetGrant returns the resourceNames of the Role's get on
// daemonsets, "" when the get is namespace-wide.
func ownDaemonSetGrant(t *testing.T, role *yaml.RNode) string {
	t.Helper()
	rules, err := role.Pipe(yaml.Lookup("rules"))
	if err != nil || rules == nil {
		t.Fatalf("Role %s has no rules", role.GetName())
	}
	els, _ := rules.Elements()
	for _, r := range els {
		res, _ := r.Pipe(yaml.Lookup("resources"))
		if res == nil || !strings.Contains(res.MustString(), "daemonsets") {
			continue
		}
		names, _ := r.Pipe(yaml.Lookup("resourceNames"))
		if names == nil {
			return ""
		}
		return strings.TrimSpace(names.MustString())
	}
	t.Fatalf("Role %s has no daemonsets rule:\n%s", role.GetName(), role.MustString())
	return ""
}

// An invalid ImagePrefetcher fails the build with the function's message,
// naming the file that declares it (kustomize passes no file names; the
// function finds it from the kustomization it runs in).
func TestKustomizeReportsErrors(t *testing.T) {
	root := writeTree(t, merge(base, overlay("bad", `patches:
- target:
    kind: ImagePrefetcher
  patch: |
    - op: add
      path: /spec/pull
      value: {parallelism: 0}
`)))
	opts := krusty.MakeDefaultOptions()
	opts.PluginConfig = types.EnabledPluginConfig(types.BploUseStaticallyLinked)
	opts.PluginConfig.FnpLoadingOptions.EnableExec = true
	// kustomize hands the function its own stderr and reports only the
	// exit status; the readable line is what users see.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	_, buildErr := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "bad"))
	os.Stderr = stderr
	w.Close()
	seen, _ := io.ReadAll(r)
	if buildErr == nil {
		t.Fatal("the build succeeded despite an invalid ImagePrefetcher")
	}
	want := "image-prefetcher-fn: error: ImagePrefetcher base-ns/demo (../base/prefetcher.yaml): spec.pull.parallelism: must be between 1 and 64, got 0\n"
	if string(seen) != want {
		t.Errorf("stderr:\n%s\nwant\n%s", seen, want)
	}
}

// kustomize runs a function from the directory of the kustomization that
// lists it: a Component there means the including kustomization's patches
// and namespace: come after the function, which then refuses to run (the
// real kustomize's case is tests/render's TestFunctionInAComponent).
func TestComponentKustomization(t *testing.T) {
	for _, tc := range []struct {
		file, content string
		want          bool
	}{
		{"kustomization.yaml", "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\ntransformers: [fn.yaml]\n", true},
		{"kustomization.yml", "kind: Component\n", true},
		{"Kustomization", "kind: Component\n", true},
		{"kustomization.yaml", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n", false},
		{"kustomization.yaml", "resources: [a.yaml]\n", false},
		{"other.yaml", "kind: Component\n", false},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := componentKustomization(dir); (got != "") != tc.want || tc.want && got != filepath.Join(dir, tc.file) {
			t.Errorf("%s %q: %q, want a component: %v", tc.file, tc.content, got, tc.want)
		}
	}
}
