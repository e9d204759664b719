package examples_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const fluxWorkflow = "examples/flux/.github/workflows/render-image-prefetcher.yaml"

type workflowStep struct {
	Name string            `json:"name"`
	Uses string            `json:"uses"`
	Run  string            `json:"run"`
	With map[string]any    `json:"with"`
	Env  map[string]string `json:"env"`
}

type workflow struct {
	Name string `json:"name"`
	// YAML 1.1, which sigs.k8s.io/yaml speaks, reads the key `on` as the
	// boolean true; GitHub reads it as the string "on".
	On          map[string]any    `json:"true"`
	Permissions map[string]string `json:"permissions"`
	Env         map[string]string `json:"env"`
	Jobs        map[string]struct {
		RunsOn string         `json:"runs-on"`
		Steps  []workflowStep `json:"steps"`
	} `json:"jobs"`
}

func (w workflow) step(t *testing.T, name string) workflowStep {
	t.Helper()
	for _, j := range w.Jobs {
		for _, s := range j.Steps {
			if s.Name == name {
				return s
			}
		}
	}
	t.Fatalf("%s has no step %q", fluxWorkflow, name)
	return workflowStep{}
}

type fluxObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Interval string `json:"interval"`
		// OCIRepository
		URL string `json:"url"`
		Ref struct {
			Tag string `json:"tag"`
		} `json:"ref"`
		// Kustomization
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

func testFlux(t *testing.T, tl tools, api *apiServer) {
	var wf workflow
	readStrict(t, tl, fluxWorkflow, &wf)
	render := wf.step(t, "Render")

	// The Render step exactly as written, the way GitHub Actions runs a
	// `run:` script (bash -e -o pipefail), from the repository root, which
	// is this example's directory once copied.
	t.Run("ci-render", func(t *testing.T) {
		dir := tl.copyTree(t, "examples/flux", t.TempDir())
		tl.run(t, dir, tl.env(), "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", render.Run)
		out, err := os.ReadFile(filepath.Join(dir, "rendered", "image-prefetcher.yaml"))
		if err != nil {
			t.Fatalf("the Render step did not write rendered/image-prefetcher.yaml: %v", err)
		}
		tl.golden(t, "examples/flux/expected.yaml", out)
		api.dryRunApply(t, out)
	})

	t.Run("publish-and-consume", func(t *testing.T) {
		publish := wf.step(t, "Publish")
		if !strings.Contains(publish.Run, "flux push artifact") || !strings.Contains(publish.Run, "--path=rendered") {
			t.Errorf("the Publish step must push the rendered/ directory with flux push artifact:\n%s", publish.Run)
		}
		if !strings.Contains(render.Run, "> rendered/") {
			t.Errorf("the Render step must write into rendered/:\n%s", render.Run)
		}
		artifact := strings.ReplaceAll(wf.Env["ARTIFACT"], "${{ github.repository_owner }}", "example-org")

		data, err := os.ReadFile(filepath.Join(tl.root, "examples/flux/clusters/production/image-prefetcher.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var repo, ks *fluxObject
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var o fluxObject
			if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
				t.Fatalf("clusters/production/image-prefetcher.yaml: %v", err)
			}
			switch o.APIVersion + " " + o.Kind {
			case "source.toolkit.fluxcd.io/v1 OCIRepository":
				repo = &o
			case "kustomize.toolkit.fluxcd.io/v1 Kustomization":
				ks = &o
			default:
				t.Errorf("unexpected object %s %s", o.APIVersion, o.Kind)
			}
		}
		if repo == nil || ks == nil {
			t.Fatal("want one OCIRepository and one Kustomization")
		}
		if repo.Spec.URL != artifact {
			t.Errorf("OCIRepository url %q, the workflow pushes to %q", repo.Spec.URL, artifact)
		}
		if tag := "--tag=" + repo.Spec.Ref.Tag; !strings.Contains(publish.Run, tag) {
			t.Errorf("OCIRepository follows tag %q, which the workflow never sets (%s)", repo.Spec.Ref.Tag, tag)
		}
		if ks.Spec.SourceRef.Kind != "OCIRepository" || ks.Spec.SourceRef.Name != repo.Metadata.Name || ks.Metadata.Namespace != repo.Metadata.Namespace {
			t.Errorf("Kustomization source %+v does not name the OCIRepository %s/%s", ks.Spec.SourceRef, repo.Metadata.Namespace, repo.Metadata.Name)
		}
		if ks.Spec.Path != "./" || !ks.Spec.Prune {
			t.Errorf("Kustomization must apply the artifact root (path ./) with prune; got path %q prune %v", ks.Spec.Path, ks.Spec.Prune)
		}
	})
}
