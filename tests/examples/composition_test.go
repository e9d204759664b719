package examples_test

import (
	"strings"
	"testing"
)

// annotated is an ImagePrefetcher that declares the function itself, for
// generators: (or, misplaced, transformers:).
func annotated(ip string) string {
	return strings.Replace(ip, "metadata:\n", "metadata:\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: image-prefetcher-fn\n", 1)
}

// tainted is an ImagePrefetcher with a startup taint and narrowed
// tolerations, as a base of its own renders it.
func tainted(name string) string {
	return "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: " + name + "\n  namespace: prefetch\nspec:\n" +
		"  images: [registry.k8s.io/pause:3.10]\n  startupTaint:\n    key: example.com/" + name + "\n  tolerations:\n  - key: dedicated\n    operator: Exists\n"
}

// TestKustomizeComposition runs the real kustomize on the compositions
// users write next: every one either renders what was asked or fails,
// naming both sides and what to change. None exits 0 with a result the
// user did not ask for.
func TestKustomizeComposition(t *testing.T) {
	tl := findTools(t)
	web := intent{namespace: "prefetch", name: "web", images: []string{"registry.k8s.io/pause:3.10"}, nodeLabel: true, admission: true}
	redeclared := web
	redeclared.images = []string{"docker.io/library/busybox:1.37"}
	const refByIntermediateName = "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: ci\n  namespace: prefetch\n" +
		"spec:\n  imageListFrom:\n    configMapRef:\n      name: base-ci-image-list\n      key: images.txt\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		dir   string
		// want: the error's words on kustomize's stderr; "" for success,
		// then out must hold every string of wantOut.
		want    []string
		wantOut []string
	}{
		{
			// 1: two bases render apart; neither saw the other's taint.
			name: "sibling layers whose startup taints deadlock a node",
			files: map[string]string{
				"a/kustomization.yaml":   "resources:\n- a.yaml\ntransformers:\n- fn.yaml\n",
				"a/a.yaml":               tainted("a"),
				"a/fn.yaml":              execFunction,
				"b/kustomization.yaml":   "resources:\n- b.yaml\ntransformers:\n- fn.yaml\n",
				"b/b.yaml":               tainted("b"),
				"b/fn.yaml":              execFunction,
				"top/kustomization.yaml": "resources:\n- ../a\n- ../b\ntransformers:\n- fn.yaml\n",
				"top/fn.yaml":            execFunction,
			},
			dir: "top",
			want: []string{"rendered by a lower layer for ImagePrefetcher prefetch/a, which has a startup taint, does not tolerate example.com/b, " +
				"the startup taint of ImagePrefetcher prefetch/b", "add {key: example.com/b, operator: Exists} to the spec.tolerations of ImagePrefetcher prefetch/a"},
		},
		{
			// 2: the upper layer's declaration would replace the lower's.
			name: "an upper layer redeclaring the lower layer's instance",
			files: map[string]string{
				"base/kustomization.yaml":  "resources:\n- web.yaml\ntransformers:\n- fn.yaml\n",
				"base/web.yaml":            web.yaml(),
				"base/fn.yaml":             execFunction,
				"upper/kustomization.yaml": "resources:\n- ../base\n- web.yaml\ntransformers:\n- fn.yaml\n",
				"upper/web.yaml":           redeclared.yaml(),
				"upper/fn.yaml":            execFunction,
			},
			dir:  "upper",
			want: []string{"ImagePrefetcher prefetch/web is declared again: a lower layer rendered ImagePrefetcher prefetch/web already"},
		},
		{
			// 5: a generator sees nothing but its own configuration.
			name: "the function's config under generators:",
			files: map[string]string{
				"gen/kustomization.yaml": "resources:\n- web.yaml\ngenerators:\n- fn.yaml\n",
				"gen/web.yaml":           web.yaml(),
				"gen/fn.yaml":            execFunction,
			},
			dir:  "gen",
			want: []string{"ConfigMap image-prefetcher-fn: metadata.annotations.config.kubernetes.io/function: is image-prefetcher-fn's configuration, and kustomize gave the function nothing else", "list this file under transformers:"},
		},
		{
			// 6: kustomize would drop the generator's config: nothing deployed.
			name: "a misspelled kind in generator mode",
			files: map[string]string{
				"typo/kustomization.yaml": "generators:\n- web.yaml\n",
				"typo/web.yaml":           strings.Replace(annotated(web.yaml()), "kind: ImagePrefetcher", "kind: Imageprefetcher", 1),
			},
			dir:  "typo",
			want: []string{`kind: "Imageprefetcher" is not a kind of image-prefetcher.stackrox.io: the function's configuration is not an ImagePrefetcher, so nothing is rendered`},
		},
		{
			// 7: the middle layer names the ConfigMap as the base renamed it.
			name: "configMapRef by an intermediate name",
			files: map[string]string{
				"base/kustomization.yaml": "namePrefix: base-\nnamespace: prefetch\nconfigMapGenerator:\n- name: ci-image-list\n  files:\n  - images.txt\n",
				"base/images.txt":         "registry.k8s.io/pause:3.10\n",
				"mid/kustomization.yaml":  "namePrefix: mid-\nresources:\n- ../base\n- ci.yaml\ntransformers:\n- fn.yaml\n",
				"mid/ci.yaml":             refByIntermediateName,
				"mid/fn.yaml":             execFunction,
			},
			dir:     "mid",
			wantOut: []string{"name: image-prefetcher-mid-ci\n", "images.txt: |\n    registry.k8s.io/pause:3.10\n"},
		},
		{
			// 8: under transformers:, kustomize never hashes the ConfigMap.
			name: "an annotated ImagePrefetcher under transformers: with no resources",
			files: map[string]string{
				"notres/kustomization.yaml": "transformers:\n- web.yaml\n",
				"notres/web.yaml":           annotated(web.yaml()),
			},
			dir:  "notres",
			want: []string{"ImagePrefetcher prefetch/web (web.yaml): metadata.annotations.config.kubernetes.io/function: is listed under transformers: of a kustomization without resources:", "list it under generators: instead"},
		},
		{
			// The same annotated ImagePrefetcher under generators: renders,
			// its ConfigMap hashed by kustomize.
			name: "an annotated ImagePrefetcher under generators:",
			files: map[string]string{
				"gen/kustomization.yaml": "generators:\n- web.yaml\n",
				"gen/web.yaml":           annotated(web.yaml()),
			},
			dir:     "gen",
			wantOut: []string{"name: image-prefetcher-web.images-"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			out, err := tl.runErr(root, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", tc.dir)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range tc.wantOut {
					if !strings.Contains(string(out), w) {
						t.Errorf("output lacks %q:\n%s", w, out)
					}
				}
				if strings.Contains(string(out), "needs-hash") || strings.Contains(string(out), "kind: ImagePrefetcher") {
					t.Errorf("output holds kustomize's needs-hash or an unexpanded ImagePrefetcher:\n%s", out)
				}
				return
			}
			if err == nil {
				t.Fatalf("kustomize build %s exited 0, want a failure with %q:\n%s", tc.dir, tc.want, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), "image-prefetcher-fn: error: ") || !strings.Contains(err.Error(), w) {
					t.Errorf("kustomize build %s: %v\nwant an error line with %q", tc.dir, err, w)
				}
			}
		})
	}
}
