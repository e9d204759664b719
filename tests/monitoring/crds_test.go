package monitoring_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"golang.org/x/tools/go/packages"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-tools/pkg/crd"
	crdmarkers "sigs.k8s.io/controller-tools/pkg/crd/markers"
	"sigs.k8s.io/controller-tools/pkg/loader"
	"sigs.k8s.io/controller-tools/pkg/markers"
	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// monitoringKinds are the prometheus-operator kinds the function renders.
var monitoringKinds = []string{monitoringv1.PodMonitorsKind, monitoringv1.PrometheusRuleKind}

// TestMonitoringCRDs holds every PodMonitor and PrometheusRule the
// monitoring pack renders against the prometheus-operator's own CRDs on a
// real kube-apiserver: the CRDs are generated here, with controller-tools,
// from the monitoring/v1 types of the version go.mod pins, installed, and
// each object is server-side applied for real with strict field validation
// and read back. A field the schema does not know, a wrong type, an enum or
// pattern the value misses, or a value the apiserver prunes or defaults
// away fails the test.
//
// The objects come from examples/monitoring built with the real kustomize
// and the function, from kustomize/monitoring, and from the function run on
// each way spec.metrics renders them (fn/render/monitoring.go).
func TestMonitoringCRDs(t *testing.T) {
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(bin)
	for _, tool := range []string{"kustomize", "image-prefetcher-fn"} {
		if _, err := os.Stat(filepath.Join(bin, tool)); err != nil {
			t.Fatalf("%s is missing: run `make build tools`", filepath.Join(bin, tool))
		}
	}
	crds := generateCRDs(t, monitoringKinds...)
	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resources := installCRDs(ctx, t, cfg, crds)

	type source struct {
		name string
		objs []*unstructured.Unstructured
		// want counts the monitoring objects the source renders.
		want map[string]int
	}
	var sources []source
	kustomize := func(dir string) []*unstructured.Unstructured {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "kustomize"), "build", "--enable-alpha-plugins", "--enable-exec", filepath.Join(root, dir))
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderrOf(err))
		}
		objs, err := cluster.DecodeManifests(out)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	sources = append(sources,
		source{"examples/monitoring", kustomize("examples/monitoring"), map[string]int{monitoringv1.PodMonitorsKind: 1, monitoringv1.PrometheusRuleKind: 1}},
		// The Grafana dashboard's ConfigMap only, today.
		source{"kustomize/monitoring", kustomize("kustomize/monitoring"), map[string]int{}},
	)
	for _, g := range []string{"metrics-monitoring", "metrics-rules-only"} {
		in, err := os.ReadFile(filepath.Join(root, "fn/cmd/image-prefetcher-fn/testdata/render", g+".in.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{monitoringv1.PrometheusRuleKind: 1}
		if g == "metrics-monitoring" {
			want[monitoringv1.PodMonitorsKind] = 1
		}
		sources = append(sources, source{"fn golden " + g, runFunction(ctx, t, bin, in), want})
	}
	// What else changes the monitoring objects: the PodMonitor alone; the
	// longest instance name and namespace (the rule group is named
	// image-prefetcher.<namespace>.<name>); the user's labels and
	// annotations, which they carry; an overall timeout that renders as a
	// Prometheus duration of every unit.
	long := strings.Repeat("n", 63)
	for _, tc := range []struct {
		name, ip string
		want     map[string]int
	}{
		{"podMonitor only", ipWith("observed", "prefetch", "", "metrics: {enabled: true, podMonitor: true}"),
			map[string]int{monitoringv1.PodMonitorsKind: 1}},
		{"long names, user metadata, odd duration", ipWith(long, long,
			"  labels: {team: platform, app.kubernetes.io/part-of: tools}\n  annotations: {argocd.argoproj.io/sync-wave: \"-1\", example.com/note: \"a: b\"}\n",
			"metrics: {enabled: true, port: 65535, podMonitor: true, rules: true}\npull: {overallTimeout: 2h0m1.5s}"),
			map[string]int{monitoringv1.PodMonitorsKind: 1, monitoringv1.PrometheusRuleKind: 1}},
	} {
		in := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nfunctionConfig:\n" + indentLines(tc.ip, "  ")
		sources = append(sources, source{"fn " + tc.name, runFunction(ctx, t, bin, []byte(in)), tc.want})
	}

	for _, s := range sources {
		t.Run(s.name, func(t *testing.T) {
			got := map[string]int{}
			for _, o := range s.objs {
				gvk := o.GroupVersionKind()
				if gvk.Group != monitoringv1.SchemeGroupVersion.Group {
					continue
				}
				got[gvk.Kind]++
				gvr, ok := resources[gvk]
				if !ok {
					t.Errorf("%s %s: %s is not one of the generated CRDs %v", gvk.Kind, o.GetName(), gvk, monitoringKinds)
					continue
				}
				applyAndReadBack(ctx, t, c, dyn.Resource(gvr).Namespace(o.GetNamespace()), o)
			}
			for _, k := range monitoringKinds {
				if got[k] != s.want[k] {
					t.Errorf("%d %s rendered, want %d", got[k], k, s.want[k])
				}
			}
		})
	}
}

// generateCRDs generates the CRDs of kinds of prometheus-operator's
// monitoring/v1, as controller-gen's crd generator does, from the source of
// the module version this module requires, without field descriptions
// (they do not validate anything).
func generateCRDs(t *testing.T, kinds ...string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	pkgPath := reflect.TypeFor[monitoringv1.PodMonitor]().PkgPath()
	roots, err := loader.LoadRoots(pkgPath)
	if err != nil {
		t.Fatalf("load %s: %v", pkgPath, err)
	}
	reg := &markers.Registry{}
	if err := crdmarkers.Register(reg); err != nil {
		t.Fatal(err)
	}
	parser := &crd.Parser{
		Collector: &markers.Collector{Registry: reg},
		Checker:   &loader.TypeChecker{NodeFilters: []loader.NodeFilter{crd.Generator{}.CheckFilter()}},
	}
	crd.AddKnownTypes(parser)
	for _, r := range roots {
		parser.NeedPackage(r)
	}
	noDescriptions := 0
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, kind := range kinds {
		gk := schema.GroupKind{Group: monitoringv1.SchemeGroupVersion.Group, Kind: kind}
		parser.NeedCRDFor(gk, &noDescriptions)
		def, ok := parser.CustomResourceDefinitions[gk]
		if !ok {
			t.Fatalf("controller-tools generated no CRD for %s from %s", gk, pkgPath)
		}
		crd.FixTopLevelMetadata(def)
		out = append(out, &def)
	}
	// Type errors are expected: the checker skips what CRDs do not need.
	if loader.PrintErrors(roots, packages.TypeError) {
		t.Fatalf("generating the CRDs from %s failed (errors above)", pkgPath)
	}
	return out
}

// installCRDs creates the CRDs, waits until the apiserver serves each
// (Established), and returns the resource of each kind.
func installCRDs(ctx context.Context, t *testing.T, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) map[schema.GroupVersionKind]schema.GroupVersionResource {
	t.Helper()
	cs, err := apiextensions.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := map[schema.GroupVersionKind]schema.GroupVersionResource{}
	for _, def := range crds {
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, def, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
			t.Fatalf("create the generated CRD %s: %v", def.Name, err)
		}
		w, err := cs.ApiextensionsV1().CustomResourceDefinitions().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", def.Name).String()})
		if err != nil {
			t.Fatal(err)
		}
		established := false
		for ev := range w.ResultChan() {
			got, ok := ev.Object.(*apiextensionsv1.CustomResourceDefinition)
			if !ok {
				continue
			}
			for _, cond := range got.Status.Conditions {
				established = established || cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue
			}
			if established {
				break
			}
		}
		w.Stop()
		if !established {
			t.Fatalf("CRD %s never became Established: %v", def.Name, ctx.Err())
		}
		for _, v := range def.Spec.Versions {
			gv := schema.GroupVersion{Group: def.Spec.Group, Version: v.Name}
			out[gv.WithKind(def.Spec.Names.Kind)] = gv.WithResource(def.Spec.Names.Plural)
		}
	}
	return out
}

// applyAndReadBack server-side applies o for real, rejecting unknown
// fields, and checks that the object read back holds what was applied:
// the CRD's structural schema prunes fields it does not declare (when the
// validation is not strict) and defaults others, and either would change
// what Prometheus is told.
func applyAndReadBack(ctx context.Context, t *testing.T, c *cluster.Cluster, ri dynamic.ResourceInterface, o *unstructured.Unstructured) {
	t.Helper()
	id := fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
	if _, err := c.CreateNamespace(ctx, o.GetNamespace()); err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	force := true
	if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "image-prefetcher-test", Force: &force, FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Errorf("%s does not validate against its CRD: %v", id, err)
		return
	}
	got, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read %s back: %v", id, err)
	}
	for _, f := range [][]string{{"spec"}, {"metadata", "labels"}, {"metadata", "annotations"}} {
		want, _, _ := unstructured.NestedFieldNoCopy(o.Object, f...)
		have, _, _ := unstructured.NestedFieldNoCopy(got.Object, f...)
		if !equality.Semantic.DeepEqual(want, have) {
			w, _ := json.MarshalIndent(want, "", "  ")
			h, _ := json.MarshalIndent(have, "", "  ")
			t.Errorf("%s: %s read back differs from what was applied:\napplied:\n%s\nread back:\n%s", id, strings.Join(f, "."), w, h)
		}
	}
}

// runFunction runs the function binary on a ResourceList and returns the
// items of its output.
func runFunction(ctx context.Context, t *testing.T, bin string, in []byte) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "image-prefetcher-fn"))
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("image-prefetcher-fn: %v\n%s", err, stderrOf(err))
	}
	var rl struct {
		Items []map[string]any `json:"items"`
	}
	if err := yaml.Unmarshal(out, &rl); err != nil {
		t.Fatalf("the function's output is not a ResourceList: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, it := range rl.Items {
		objs = append(objs, &unstructured.Unstructured{Object: it})
	}
	return objs
}

// ipWith is an ImagePrefetcher with extra metadata lines and a spec.
func ipWith(name, namespace, meta, spec string) string {
	return "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: " + name + "\n  namespace: " + namespace + "\n" + meta +
		"spec:\n  images: [registry.k8s.io/pause:3.10]\n" + indentLines(spec+"\n", "  ")
}

func indentLines(s, pad string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "")
}

func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
