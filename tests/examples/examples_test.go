package examples_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kustomizeCase is one `kustomize build` a README tells users to run.
type kustomizeCase struct {
	name string
	// copy is the directory a user copies (relative to the repository root).
	copy string
	// from is where the README says to run the command, relative to the
	// parent of the copy ("" = the parent itself).
	from string
	// target is the kustomization argument, relative to from.
	target string
	// readme documents the command.
	readme string
	// golden is the expected output (relative to the repository root).
	golden string
	// ocp marks outputs that carry OpenShift objects to cross-check.
	ocp bool
}

const kustomizeBuild = "kustomize build --enable-alpha-plugins --enable-exec"

var kustomizeCases = []kustomizeCase{
	{name: "kustomize/overlays/vanilla", copy: "kustomize", target: "kustomize/overlays/vanilla", readme: "docs/integrations/kustomize.md", golden: "kustomize/overlays/vanilla/expected.yaml"},
	{name: "kustomize/overlays/ocp", copy: "kustomize", target: "kustomize/overlays/ocp", readme: "docs/integrations/kustomize.md", golden: "kustomize/overlays/ocp/expected.yaml", ocp: true},
	{name: "examples/quickstart", copy: "examples/quickstart", from: "quickstart", target: ".", readme: "examples/quickstart/README.md", golden: "examples/quickstart/expected.yaml"},
	{name: "examples/image-list-file", copy: "examples/image-list-file", from: "image-list-file", target: ".", readme: "examples/image-list-file/README.md", golden: "examples/image-list-file/expected.yaml"},
	{name: "examples/overlays/vanilla", copy: "examples/overlays", from: "overlays", target: "vanilla", readme: "examples/overlays/README.md", golden: "examples/overlays/vanilla/expected.yaml"},
	{name: "examples/overlays/ocp", copy: "examples/overlays", from: "overlays", target: "ocp", readme: "examples/overlays/README.md", golden: "examples/overlays/ocp/expected.yaml", ocp: true},
	{name: "examples/private-registry", copy: "examples/private-registry", from: "private-registry", target: ".", readme: "examples/private-registry/README.md", golden: "examples/private-registry/expected.yaml"},
	{name: "examples/monitoring", copy: "examples/monitoring", from: "monitoring", target: ".", readme: "examples/monitoring/README.md", golden: "examples/monitoring/expected.yaml"},
	{name: "examples/scheduling", copy: "examples/scheduling", from: "scheduling", target: ".", readme: "examples/scheduling/README.md", golden: "examples/scheduling/expected.yaml"},
	{name: "examples/workloads", copy: "examples/workloads", from: "workloads", target: ".", readme: "examples/workloads/README.md", golden: "examples/workloads/expected.yaml"},
}

// TestExamples renders everything users are told to render, with the real
// tools, from a copy of the directory they would copy, compares each result
// with its golden file and server-side dry-run applies it to a real
// kube-apiserver. One apiserver serves all subtests.
func TestExamples(t *testing.T) {
	tl := findTools(t)
	api := startAPIServer(t)

	for _, tc := range kustomizeCases {
		t.Run("kustomize/"+tc.name, func(t *testing.T) {
			cmd := kustomizeBuild + " " + tc.target
			tl.readmeDocuments(t, tc.readme, cmd)
			tmp := t.TempDir()
			tl.copyTree(t, tc.copy, tmp)
			dir := filepath.Join(tmp, tc.from)
			argv := append([]string{"kustomize"}, strings.Fields(cmd)[1:]...)
			argv[0] = tl.kustomize
			out := tl.run(t, dir, tl.env(), argv...)
			tl.golden(t, tc.golden, out)
			api.dryRunApply(t, out)
			if tc.ocp {
				checkOpenShiftWiring(t, out)
			}
		})
	}

	t.Run("kpt", func(t *testing.T) { testKpt(t, tl, api) })
	t.Run("kpt-examples", func(t *testing.T) { testKptExamples(t, tl, api) })
	t.Run("kpt-live-apply", func(t *testing.T) { testKptLiveApply(t, tl, api) })
	t.Run("argocd", func(t *testing.T) { testArgoCD(t, tl, api) })
	t.Run("flux", func(t *testing.T) { testFlux(t, tl, api) })
	t.Run("argocd-staged", func(t *testing.T) { testArgoCDStaged(t, tl, api) })
	t.Run("flux-staged", func(t *testing.T) { testFluxStaged(t, tl, api) })
	t.Run("scc-namereference", func(t *testing.T) { testSCCNameReferenceWithClusterSchema(t, tl, api) })
	t.Run("pod-security", func(t *testing.T) { testPodSecurity(t, tl, api) })
	t.Run("docs-own-overlay", func(t *testing.T) { testDocsOwnOverlay(t, tl, api) })
}

// Every example directory has a README and is covered by a test above.
func TestEveryExampleIsTested(t *testing.T) {
	tl := findTools(t)
	covered := map[string]bool{"kpt": true, "argocd": true, "flux": true}
	for _, tc := range kustomizeCases {
		if rest, ok := strings.CutPrefix(tc.copy, "examples/"); ok {
			covered[rest] = true
		}
	}
	// Every kustomize-shaped example has a kpt path too (kpt_examples_test.go).
	kpt := map[string]bool{}
	for _, kc := range kptCases {
		kpt[kc.name] = true
	}
	for _, tc := range kustomizeCases {
		if !kpt[tc.name] {
			t.Errorf("%s has no entry in kptCases", tc.name)
		}
	}
	entries, err := os.ReadDir(filepath.Join(tl.root, "examples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if !covered[e.Name()] {
			t.Errorf("examples/%s is not rendered by any test", e.Name())
		}
		if _, err := os.Stat(filepath.Join(tl.root, "examples", e.Name(), "README.md")); err != nil {
			t.Errorf("examples/%s has no README.md", e.Name())
		}
	}
}
