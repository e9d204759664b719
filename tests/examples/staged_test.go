package examples_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// The staged-rollout examples (docs/staged-rollouts.md): an app and an
// ImagePrefetcher that reads its images from the app, rendered in one
// build, applied in two stages.

const (
	syncWave         = "argocd.argoproj.io/sync-wave"
	partOfLabel      = "app.kubernetes.io/part-of"
	partOfPrefetcher = "image-prefetcher"
	managedByLabel   = "app.kubernetes.io/managed-by"
	managedByFn      = "image-prefetcher-fn"
)

// listImages returns the references of the rendered image list.
func listImages(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetLabels()[managedByLabel] != managedByFn {
			continue
		}
		text, _, _ := unstructured.NestedString(o.Object, "data", "images.txt")
		var refs []string
		for _, l := range strings.Split(text, "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				refs = append(refs, l)
			}
		}
		return refs
	}
	t.Fatal("no rendered image-list ConfigMap")
	return nil
}

// assertGated checks that the rendered DaemonSet's pods become ready only
// with every image present: the fetch init container fails otherwise.
func assertGated(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" || o.GetLabels()[managedByLabel] != managedByFn {
			continue
		}
		inits, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "initContainers")
		for _, c := range inits {
			args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
			if len(args) > 0 && args[0] == "fetch" && slices.Contains(args, "--fail-on-error") {
				return
			}
		}
		t.Errorf("DaemonSet %s: the fetch init container does not fail until every image is present (spec.rollout.requireAllImages)", o.GetName())
		return
	}
	t.Error("no rendered DaemonSet")
}

// wantShopList is the list both staged examples render: the Deployment's
// tag after the kustomization's images: override, and the StatefulSet's.
var wantShopList = []string{"ghcr.io/example/shop-web:1.5.0", "docker.io/library/redis:7.4"}

// testArgoCDStaged renders examples/argocd/staged/app with the plugin's
// generate command and checks the waves: the prefetcher's namespace and the
// ImagePrefetcher are in wave -1, the workloads in the default wave.
func testArgoCDStaged(t *testing.T, tl tools, api *apiServer) {
	var plugin configManagementPlugin
	readStrict(t, tl, "examples/argocd/plugin.yaml", &plugin)
	var app argoApplication
	readStrict(t, tl, "examples/argocd/staged/application.yaml", &app)
	if app.Spec.Source.Plugin.Name != plugin.Metadata.Name {
		t.Errorf("staged/application.yaml uses plugin %q, plugin.yaml defines %q", app.Spec.Source.Plugin.Name, plugin.Metadata.Name)
	}

	dir := tl.copyTree(t, "examples/argocd/staged/app", t.TempDir())
	src := decodeObjects(t, readFile(t, tl, "examples/argocd/staged/app/imageprefetcher.yaml"))
	if len(src) != 1 || src[0].GetAnnotations()[syncWave] != "-1" {
		t.Fatalf("the ImagePrefetcher must carry %s: \"-1\"", syncWave)
	}
	out := tl.run(t, dir, tl.env(), slices.Concat(plugin.Spec.Generate.Command, plugin.Spec.Generate.Args)...)
	tl.golden(t, "examples/argocd/staged/expected.yaml", out)
	api.dryRunApply(t, out)

	objs := decodeObjects(t, out)
	if got := listImages(t, objs); !slices.Equal(got, wantShopList) {
		t.Errorf("rendered list %q, want %q", got, wantShopList)
	}
	assertGated(t, objs)
	for _, o := range objs {
		wave := o.GetAnnotations()[syncWave]
		switch {
		case o.GetKind() == "Namespace" && o.GetName() == "image-prefetcher":
			if wave != "-1" {
				t.Errorf("Namespace image-prefetcher is in wave %q, want -1: the prefetcher's objects live in it", wave)
			}
		case o.GetLabels()[managedByLabel] == managedByFn:
		default:
			if n, err := strconv.Atoi(wave); wave != "" && (err != nil || n < 0) {
				t.Errorf("%s %s is in wave %s, before the prefetcher is ready", o.GetKind(), o.GetName(), wave)
			}
		}
	}
}

// fluxStagedObject is the part of the Flux objects the staged example sets.
type fluxStagedObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Interval string `json:"interval"`
		URL      string `json:"url"`
		Ref      struct {
			Tag string `json:"tag"`
		} `json:"ref"`
		DependsOn []struct {
			Name string `json:"name"`
		} `json:"dependsOn"`
		SourceRef struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"sourceRef"`
		Path    string `json:"path"`
		Prune   bool   `json:"prune"`
		Wait    bool   `json:"wait"`
		Timeout string `json:"timeout"`
	} `json:"spec"`
}

const fluxStagedWorkflow = "examples/flux/staged/.github/workflows/render-shop.yaml"

// testFluxStaged runs the staged workflow's Render step exactly as written
// (it splits one build into prefetch/ and app/) and checks the two
// Kustomizations that apply them: app/ depends on prefetch/, which waits
// for its DaemonSet.
func testFluxStaged(t *testing.T, tl tools, api *apiServer) {
	var wf workflow
	readStrict(t, tl, fluxStagedWorkflow, &wf)
	var render, publish workflowStep
	for _, j := range wf.Jobs {
		for _, s := range j.Steps {
			switch s.Name {
			case "Render":
				render = s
			case "Publish":
				publish = s
			}
		}
	}
	if render.Run == "" || !strings.Contains(publish.Run, "--path=rendered") {
		t.Fatalf("%s must have a Render step and a Publish step pushing rendered/", fluxStagedWorkflow)
	}

	dir := tl.copyTree(t, "examples/flux/staged", t.TempDir())
	tl.run(t, dir, tl.env(), "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", render.Run)
	stages := map[string][]byte{}
	for _, stage := range []string{"prefetch", "app"} {
		out, err := os.ReadFile(filepath.Join(dir, "rendered", stage, stage+".yaml"))
		if err != nil {
			t.Fatalf("the Render step did not write rendered/%s/%s.yaml: %v", stage, stage, err)
		}
		tl.golden(t, "examples/flux/staged/expected-"+stage+".yaml", out)
		stages[stage] = out
	}
	// The stages are applied in order, as Flux would.
	api.dryRunApply(t, append(append(stages["prefetch"], "---\n"...), stages["app"]...))

	prefetch, app := decodeObjects(t, stages["prefetch"]), decodeObjects(t, stages["app"])
	if got := listImages(t, prefetch); !slices.Equal(got, wantShopList) {
		t.Errorf("rendered list %q, want %q", got, wantShopList)
	}
	assertGated(t, prefetch)
	kinds := map[string]bool{}
	for _, o := range prefetch {
		kinds[o.GetKind()] = true
		if o.GetLabels()[partOfLabel] != partOfPrefetcher {
			t.Errorf("prefetch stage holds %s %s, not part of the prefetcher", o.GetKind(), o.GetName())
		}
	}
	for _, k := range []string{"Namespace", "DaemonSet", "ConfigMap", "ServiceAccount"} {
		if !kinds[k] {
			t.Errorf("prefetch stage has no %s", k)
		}
	}
	for _, o := range app {
		if o.GetLabels()[partOfLabel] == partOfPrefetcher || o.GetKind() == "ImagePrefetcher" {
			t.Errorf("app stage holds %s %s of the prefetcher", o.GetKind(), o.GetName())
		}
	}
	if len(app) != 3 {
		t.Errorf("app stage has %d objects, want the shop Namespace, Deployment and StatefulSet", len(app))
	}

	data := readFile(t, tl, "examples/flux/staged/clusters/production/shop.yaml")
	var repo *fluxStagedObject
	ks := map[string]*fluxStagedObject{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var o fluxStagedObject
		if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
			t.Fatalf("clusters/production/shop.yaml: %v", err)
		}
		switch o.APIVersion + " " + o.Kind {
		case "source.toolkit.fluxcd.io/v1 OCIRepository":
			repo = &o
		case "kustomize.toolkit.fluxcd.io/v1 Kustomization":
			ks[o.Spec.Path] = &o
		default:
			t.Errorf("unexpected object %s %s", o.APIVersion, o.Kind)
		}
	}
	first, second := ks["./prefetch"], ks["./app"]
	if repo == nil || first == nil || second == nil {
		t.Fatal("want an OCIRepository and Kustomizations for ./prefetch and ./app")
	}
	if artifact := strings.ReplaceAll(wf.Env["ARTIFACT"], "${{ github.repository_owner }}", "example-org"); repo.Spec.URL != artifact {
		t.Errorf("OCIRepository url %q, the workflow pushes to %q", repo.Spec.URL, artifact)
	}
	for _, k := range []*fluxStagedObject{first, second} {
		if k.Spec.SourceRef.Name != repo.Metadata.Name || k.Metadata.Namespace != repo.Metadata.Namespace {
			t.Errorf("Kustomization %s does not read the OCIRepository", k.Metadata.Name)
		}
	}
	if !first.Spec.Wait {
		t.Errorf("Kustomization %s must wait: its readiness is the DaemonSet's rollout", first.Metadata.Name)
	}
	if d, err := time.ParseDuration(first.Spec.Timeout); err != nil || d <= 20*time.Minute {
		t.Errorf("Kustomization %s timeout %q, want more than the default pull.overallTimeout of 20m", first.Metadata.Name, first.Spec.Timeout)
	}
	if len(second.Spec.DependsOn) != 1 || second.Spec.DependsOn[0].Name != first.Metadata.Name {
		t.Errorf("Kustomization %s must depend on %s, got %+v", second.Metadata.Name, first.Metadata.Name, second.Spec.DependsOn)
	}
}
