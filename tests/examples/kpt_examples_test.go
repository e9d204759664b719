package examples_test

import (
	"cmp"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// kptCase is the kpt path of one kustomize-shaped example (one entry of
// kustomizeCases, same name). Its kpt package is a copy of the plain
// resource files the example's kustomization lists, with a Kptfile whose
// pipeline runs image-prefetcher-fn as an exec mutator; the files of the
// kustomization itself (kustomization.yaml, the function declaration
// function.yaml) have no meaning to kpt and are left out.
//
// kpt has no builtin transformers and no generators: everything a
// kustomization does besides listing resources and the function is missing
// from the kpt result. kustomizeOnly lists those features of the example,
// each with what it changes, and decides what the kpt result is compared
// with:
//
//   - none: the normalized kpt result must equal the normalized kustomize
//     golden, object for object;
//   - some, and kpt renders: the result is compared with golden, a kpt
//     golden of its own (expected-kpt.yaml), and sameUpTo says how it may
//     differ from the kustomize golden;
//   - some, and the function cannot work without them: wantErr holds what
//     kpt must report, so that the limitation stays documented by a test.
type kptCase struct {
	name string
	// dir holds files, relative to the repository root.
	dir   string
	files []string
	// kustomizeOnly: features of the kustomization kpt cannot apply.
	kustomizeOnly []string
	// golden is the kpt golden (normalized), when the result differs from
	// the kustomize golden.
	golden string
	// sameUpTo, with golden: the kpt result equals the kustomize golden
	// after this rewrite of both (what the kustomize-only features change).
	sameUpTo func(string) string
	// wantErr: kpt cannot render the package; its output names these.
	wantErr []string
}

var kptCases = []kptCase{
	{
		name:  "kustomize/overlays/vanilla",
		dir:   "kustomize/base",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
		kustomizeOnly: []string{
			"resources: ../../base (a kustomization in another directory; kpt reads one package, so the package here is the base's resource files)",
			"patches: imageprefetcher-patch.yaml (the strategic-merge patch that sets the overlay's images and nodeSelector; kpt has no patches)",
		},
		// Without the overlay's patch only the base is rendered: both
		// overlays have the same kpt result.
		golden: "kustomize/base/expected-kpt.yaml",
	},
	{
		name:  "kustomize/overlays/ocp",
		dir:   "kustomize/base",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
		kustomizeOnly: []string{
			"resources: ../../base (as vanilla)",
			"patches: imageprefetcher-patch.yaml (flavor ocp, the worker nodeSelector and the pull secret; without it kpt renders the base, with no SCC)",
			"configurations: scc-namereference.yaml (kustomize's nameReference entries for the SCC; kpt renames nothing)",
		},
		golden: "kustomize/base/expected-kpt.yaml",
	},
	{
		name:  "examples/quickstart",
		dir:   "examples/quickstart",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
		kustomizeOnly: []string{
			"generators: imageprefetcher.yaml (kpt has no generators; the ImagePrefetcher is an ordinary resource of the package, and its config.kubernetes.io/function annotation means nothing to kpt)",
			"the content hash kustomize appends to a generator's ConfigMap (image-prefetcher-quickstart.images-<hash>) and to the DaemonSet's reference to it",
		},
		golden:   "examples/quickstart/expected-kpt.yaml",
		sameUpTo: stripHashSuffix("image-prefetcher-quickstart.images"),
	},
	{
		name:  "examples/image-list-file",
		dir:   "examples/image-list-file",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
		kustomizeOnly: []string{
			"namespace: image-prefetcher (the ImagePrefetcher's file has no namespace of its own)",
			"configMapGenerator: image-list from images.txt (the ConfigMap spec.imageListFrom reads; kpt cannot make a ConfigMap from a file)",
		},
		wantErr: []string{
			"ImagePrefetcher/from-file metadata.namespace: is required",
			"spec.imageListFrom.configMapRef.name: ConfigMap /image-list is not in the ResourceList",
		},
	},
	{
		name:  "examples/overlays/vanilla",
		dir:   "examples/overlays/base",
		files: []string{"imageprefetcher.yaml"},
		kustomizeOnly: []string{
			"configMapGenerator: ci-image-list from images.txt, in the base (kpt cannot make a ConfigMap from a file)",
			"resources: ../base, namespace: team-a-prefetch, namePrefix: team-a-, patches: imageprefetcher-patch.yaml (the overlay's whole content)",
		},
		wantErr: []string{"spec.imageListFrom.configMapRef.name: ConfigMap default/ci-image-list is not in the ResourceList"},
	},
	{
		name:  "examples/overlays/ocp",
		dir:   "examples/overlays/base",
		files: []string{"imageprefetcher.yaml"},
		kustomizeOnly: []string{
			"configMapGenerator: ci-image-list from images.txt, in the base (as vanilla)",
			"resources: ../base, namespace: team-b-prefetch, namePrefix: team-b-, patches: imageprefetcher-patch.yaml (the overlay's whole content, flavor ocp included)",
		},
		wantErr: []string{"spec.imageListFrom.configMapRef.name: ConfigMap default/ci-image-list is not in the ResourceList"},
	},
	{
		name:  "examples/private-registry",
		dir:   "examples/private-registry",
		files: []string{"namespace.yaml", "imageprefetcher-pull-secrets.yaml", "imageprefetcher-credential-provider.yaml"},
		kustomizeOnly: []string{
			"namespace: image-prefetcher (neither ImagePrefetcher file has a namespace of its own)",
		},
		wantErr: []string{
			"ImagePrefetcher/private metadata.namespace: is required",
			"ImagePrefetcher/ecr metadata.namespace: is required",
		},
	},
	{
		name:  "examples/monitoring",
		dir:   "examples/monitoring",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
	},
	{
		name:  "examples/scheduling",
		dir:   "examples/scheduling",
		files: []string{"namespace.yaml", "imageprefetcher-gpu.yaml", "inference-deployment.yaml", "batch-job.yaml"},
	},
	{
		name:  "examples/workloads",
		dir:   "examples/workloads",
		files: []string{"namespace.yaml", "imageprefetcher.yaml", "app/namespace.yaml", "app/deployment.yaml", "app/cronjob.yaml", "app/statefulset.yaml"},
		kustomizeOnly: []string{
			"images: shop-web and shop-report at 1.5.0 (kpt has no builtin images transformer: the package deploys, and the function prefetches, the 1.4.0 written in the files)",
		},
		golden: "examples/workloads/expected-kpt.yaml",
		// The tags, and so the DaemonSet's config hash and list digest,
		// are what differs.
		sameUpTo: func(s string) string {
			s = configHash.ReplaceAllString(strings.ReplaceAll(s, ":1.5.0", ":1.4.0"), "$1<hash>")
			return listDigest.ReplaceAllString(s, "$1<digest>")
		},
	},
	// The Argo CD and Flux examples render their app/ directory with
	// kustomize too (tests in argocd_test.go and flux_test.go).
	{
		name:  "examples/argocd",
		dir:   "examples/argocd/app",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
	},
	{
		name:  "examples/flux",
		dir:   "examples/flux/app",
		files: []string{"namespace.yaml", "imageprefetcher.yaml"},
	},
}

// configHash is the DaemonSet's pod-template hash of the list and settings.
var (
	configHash = regexp.MustCompile(`(image-prefetcher.stackrox.io/config-hash: )[0-9a-f]{64}`)
	listDigest = regexp.MustCompile(`(image-prefetcher.stackrox.io/list-digest: )[0-9a-f]{16}`)
)

// kustomizeGolden is the kustomize golden of a kpt case.
func kustomizeGolden(t *testing.T, name string) string {
	t.Helper()
	switch name {
	case "examples/argocd":
		return "examples/argocd/expected.yaml"
	case "examples/flux":
		return "examples/flux/expected.yaml"
	}
	for _, tc := range kustomizeCases {
		if tc.name == name {
			return tc.golden
		}
	}
	t.Fatalf("kpt case %s has no kustomize case", name)
	return ""
}

// The kpt package's Kptfile: the function as the only mutator, found on
// PATH as in examples/kpt/exec, with no configPath, so that it expands
// every ImagePrefetcher of the package.
const kptfileForExamples = `apiVersion: kpt.dev/v1
kind: Kptfile
metadata:
  name: example
  annotations:
    config.kubernetes.io/local-config: "true"
pipeline:
  mutators:
  - exec: image-prefetcher-fn
`

// testKptExamples renders every kustomize-shaped example with the real kpt,
// both ways examples/kpt/README.md shows (kpt fn render --allow-exec, and
// kpt fn source | kpt fn eval --exec | kpt fn sink), and compares the
// result as kptCase says.
func testKptExamples(t *testing.T, tl tools, api *apiServer) {
	for _, kc := range kptCases {
		t.Run(kc.name, func(t *testing.T) {
			for _, mode := range []string{"render", "source-eval-sink"} {
				t.Run(mode, func(t *testing.T) {
					pkg := filepath.Join(t.TempDir(), "pkg")
					if err := os.MkdirAll(pkg, 0o755); err != nil {
						t.Fatal(err)
					}
					for _, f := range kc.files {
						data, err := os.ReadFile(filepath.Join(tl.root, kc.dir, f))
						if err != nil {
							t.Fatal(err)
						}
						if err := os.MkdirAll(filepath.Dir(filepath.Join(pkg, f)), 0o755); err != nil {
							t.Fatal(err)
						}
						if err := os.WriteFile(filepath.Join(pkg, f), data, 0o644); err != nil {
							t.Fatal(err)
						}
					}
					if err := os.WriteFile(filepath.Join(pkg, "Kptfile"), []byte(kptfileForExamples), 0o644); err != nil {
						t.Fatal(err)
					}
					// Run from the package's parent, with relative paths,
					// as a user who copied the directory would.
					dir := filepath.Dir(pkg)
					var argv []string
					switch mode {
					case "render":
						argv = []string{tl.kpt, "fn", "render", "--allow-exec", "pkg", "-o", "rendered"}
					default:
						argv = []string{"bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
							"kpt fn source pkg | kpt fn eval - --exec image-prefetcher-fn | kpt fn sink rendered"}
					}
					out, err := tl.runErr(dir, tl.env(), argv...)
					if kc.wantErr != nil {
						if err == nil {
							t.Fatalf("kpt rendered a package that lacks %s; update kptCases and docs/integrations/kpt.md:\n%s", strings.Join(kc.kustomizeOnly, "; "), out)
						}
						for _, w := range kc.wantErr {
							if !strings.Contains(err.Error(), w) {
								t.Errorf("kpt's failure does not say %q:\n%v", w, err)
							}
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					got := normalizeKRM(t, concatYAML(t, filepath.Join(dir, "rendered"), nil))
					want := normalizeKRM(t, readFile(t, tl, kustomizeGolden(t, kc.name)))
					if kc.golden == "" {
						if got != want {
							t.Errorf("kpt's result differs from the kustomize golden %s after normalization:\n%s", kustomizeGolden(t, kc.name), lineDiff([]byte(want), []byte(got)))
						}
					} else {
						// -update writes the kpt golden from the render
						// subtest only; the pipe is always compared with it.
						if mode == "render" {
							tl.golden(t, kc.golden, []byte(got))
						} else if g := string(readFile(t, tl, kc.golden)); got != g {
							t.Errorf("output differs from %s:\n%s", kc.golden, lineDiff([]byte(g), []byte(got)))
						}
						if kc.sameUpTo != nil && kc.sameUpTo(got) != kc.sameUpTo(want) {
							t.Errorf("kpt's result differs from the kustomize golden by more than %s:\n%s", strings.Join(kc.kustomizeOnly, "; "), lineDiff([]byte(kc.sameUpTo(want)), []byte(kc.sameUpTo(got))))
						}
						if kc.sameUpTo == nil && got == want {
							t.Errorf("kpt's result equals the kustomize golden: %s make no difference; drop golden and kustomizeOnly", strings.Join(kc.kustomizeOnly, "; "))
						}
					}
					api.dryRunApply(t, []byte(got))
				})
			}
		})
	}
}

func readFile(t *testing.T, tl tools, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tl.root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// kptFileAnnotations are how kpt maps objects to the files of a package
// (and kyaml's internal bookkeeping of the same); kustomize's output has
// none of them.
var kptFileAnnotations = []string{
	"config.kubernetes.io/path",
	"config.kubernetes.io/index",
	"config.k8s.io/id",
	"internal.config.kubernetes.io/path",
	"internal.config.kubernetes.io/index",
	"internal.config.kubernetes.io/id",
	"internal.config.kubernetes.io/seqindent",
	"internal.config.kubernetes.io/annotations-migration-resource-id",
}

// normalizeKRM puts a kpt package and a kustomize output into one form,
// so that they can be compared object for object:
//
//  1. the Kptfile and every object annotated config.kubernetes.io/local-config
//     "true" are dropped: kustomize leaves local-config objects out of its
//     output, kpt keeps them as files of the package;
//  2. kpt's file annotations (kptFileAnnotations) are removed, and an
//     annotations map left empty with them;
//  3. the objects are sorted by apiVersion, kind, namespace and name (kpt
//     keeps them in file order, kustomize in its own kind order) and
//     printed with sorted keys, without comments (kpt keeps comments of
//     the source files, kustomize drops them).
//
// Nothing else is touched: every field value, label and other annotation
// must be the same.
func normalizeKRM(t *testing.T, stream []byte) string {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, o := range decodeObjects(t, stream) {
		if o.GetKind() == "Kptfile" || o.GetAnnotations()["config.kubernetes.io/local-config"] == "true" {
			continue
		}
		if a := o.GetAnnotations(); a != nil {
			for _, k := range kptFileAnnotations {
				delete(a, k)
			}
			if len(a) == 0 {
				unstructured.RemoveNestedField(o.Object, "metadata", "annotations")
			} else {
				o.SetAnnotations(a)
			}
		}
		objs = append(objs, o)
	}
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
		return cmp.Or(cmp.Compare(a.GetAPIVersion(), b.GetAPIVersion()), cmp.Compare(a.GetKind(), b.GetKind()),
			cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	var b strings.Builder
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatalf("marshal %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.String()
}

// stripHashSuffix returns a rewrite that removes the -<hash> kustomize
// appends to the generated ConfigMap name.
func stripHashSuffix(name string) func(string) string {
	return func(s string) string {
		var b strings.Builder
		for {
			i := strings.Index(s, name+"-")
			if i < 0 {
				b.WriteString(s)
				return b.String()
			}
			b.WriteString(s[:i+len(name)])
			s = s[i+len(name)+1:]
			// kustomize's hash: 10 characters of [a-z0-9].
			j := 0
			for j < len(s) && (s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			if j != 10 || len(s) > j && (s[j] == '-' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9') {
				b.WriteString("-")
				continue
			}
			s = s[j:]
		}
	}
}
