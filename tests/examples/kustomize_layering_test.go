package examples_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// execFunction declares the function under a kustomization's
// transformers:, by the bare name that PATH resolves.
const execFunction = `apiVersion: v1
kind: ConfigMap
metadata:
  name: image-prefetcher-fn
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: image-prefetcher-fn
`

// TestKustomizeLayering runs the real standalone kustomize on layered
// kustomizations that each run the function: a base renders instance a, an
// overlay patches a's DaemonSet and renders instance b, and a kustomization
// above runs the function once more with nothing to render. Output rendered
// below is neither pruned nor rendered again, so the overlay's patch
// survives, and every instance is rendered exactly once.
func TestKustomizeLayering(t *testing.T) {
	tl := findTools(t)
	intentA := intent{namespace: "prefetch", name: "a", images: []string{"registry.k8s.io/pause:3.10"}, nodeLabel: true, admission: true, localConfig: true}
	intentB := intent{namespace: "prefetch", name: "b", images: []string{"docker.io/library/busybox:1.37"}, flavor: "ocp", nodeLabel: true, admission: true}
	const patch = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: image-prefetcher-a
  namespace: prefetch
  labels:
    patched-by: overlay
spec:
  template:
    spec:
      priorityClassName: system-node-critical
`
	files := map[string]string{
		"base/kustomization.yaml": "resources:\n- namespace.yaml\n- a.yaml\ntransformers:\n- fn.yaml\n",
		"base/namespace.yaml":     inplaceNamespace,
		"base/a.yaml":             intentA.yaml(),
		"base/fn.yaml":            execFunction,
		// b as a transformer's input, after the patch of a's DaemonSet
		// (kustomize runs patches before transformers:).
		"overlay/kustomization.yaml": "resources:\n- ../base\n- b.yaml\npatches:\n- path: patch.yaml\ntransformers:\n- fn.yaml\n",
		"overlay/b.yaml":             intentB.yaml(),
		"overlay/patch.yaml":         patch,
		"overlay/fn.yaml":            execFunction,
		// b as a generator: its objects are generated, then the patch.
		"generator/kustomization.yaml": "resources:\n- ../base\ngenerators:\n- b.yaml\npatches:\n- path: patch.yaml\n",
		"generator/b.yaml":             strings.Replace(intentB.yaml(), "metadata:\n", "metadata:\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: image-prefetcher-fn\n", 1),
		"generator/patch.yaml":         patch,
		// The function once more, with no ImagePrefetcher left to render.
		"top/kustomization.yaml": "resources:\n- ../overlay\ntransformers:\n- fn.yaml\n",
		"top/fn.yaml":            execFunction,
	}
	root := t.TempDir()
	writeTree(t, root, files)
	hash := regexp.MustCompile(`^(ConfigMap prefetch/image-prefetcher-b\.images)-[a-z0-9]{10}$`)
	for _, tc := range []struct {
		dir       string
		instances []intent
	}{
		{"base", []intent{intentA}},
		{"overlay", []intent{intentA, intentB}},
		{"generator", []intent{intentA, intentB}},
		{"top", []intent{intentA, intentB}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			out := tl.run(t, root, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", tc.dir)
			want := []string{"Namespace prefetch"}
			for _, i := range tc.instances {
				want = append(want, i.objects()...)
			}
			slices.Sort(want)
			var got []string
			patched := false
			for _, o := range decodeObjects(t, out) {
				key := o.GetKind() + " " + o.GetName()
				if o.GetNamespace() != "" {
					key = o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
				}
				got = append(got, hash.ReplaceAllString(key, "$1"))
				if o.GetKind() == "Namespace" {
					continue
				}
				instance := o.GetLabels()["app.kubernetes.io/instance"]
				if mark := o.GetAnnotations()["image-prefetcher.stackrox.io/rendered-for"]; mark != "prefetch/"+instance {
					t.Errorf("%s: rendered-for %q, want prefetch/%s", key, mark, instance)
				}
				if o.GetKind() == "DaemonSet" && o.GetName() == "image-prefetcher-a" {
					pc, _, _ := unstructuredString(o.Object, "spec", "template", "spec", "priorityClassName")
					patched = o.GetLabels()["patched-by"] == "overlay" && pc == "system-node-critical"
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("kustomize build %s:\n  %s\nwant\n  %s", tc.dir, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
			if wantPatch := tc.dir != "base"; patched != wantPatch {
				t.Errorf("a's DaemonSet carries the overlay's patch: %t, want %t\n%s", patched, wantPatch, out)
			}
		})
	}
}

// TestKustomizeLayersRefused runs the real kustomize where layers meet. A
// namePrefix in the kustomization that lists the function is applied
// before the function runs (kustomize runs transformers: last), so the
// instance takes the prefixed name, a distinct identity. A prefix above a
// rendering renames its output only: two such copies share one instance,
// and a layer that sees both refuses them, as it refuses an instance with
// the name of one a lower layer rendered. Errors name both.
func TestKustomizeLayersRefused(t *testing.T) {
	tl := findTools(t)
	web := intent{namespace: "prefetch", name: "web", images: []string{"registry.k8s.io/pause:3.10"}, nodeLabel: true, admission: true}
	other := web
	other.namespace = "other"
	files := map[string]string{
		"base/kustomization.yaml":     "resources:\n- web.yaml\ntransformers:\n- fn.yaml\n",
		"base/web.yaml":               web.yaml(),
		"base/fn.yaml":                execFunction,
		"a/kustomization.yaml":        "namePrefix: a-\nresources:\n- ../base\n",
		"b/kustomization.yaml":        "namePrefix: b-\nresources:\n- ../base\n",
		"copies/kustomization.yaml":   "resources:\n- ../a\n- ../b\ntransformers:\n- fn.yaml\n",
		"copies/fn.yaml":              execFunction,
		"upper/kustomization.yaml":    "resources:\n- ../base\n- other.yaml\ntransformers:\n- fn.yaml\n",
		"upper/other.yaml":            other.yaml(),
		"upper/fn.yaml":               execFunction,
		"prefixed/kustomization.yaml": "namePrefix: x-\nresources:\n- ../base/web.yaml\ntransformers:\n- ../base/fn.yaml\n",
	}
	root := t.TempDir()
	writeTree(t, root, files)
	build := func(dir string) ([]byte, error) {
		return tl.runErr(root, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", "--load-restrictor", "LoadRestrictionsNone", dir)
	}
	out, err := build("prefixed")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range decodeObjects(t, out) {
		if o.GetKind() == "DaemonSet" && (o.GetName() != "image-prefetcher-x-web" || o.GetAnnotations()["image-prefetcher.stackrox.io/rendered-for"] != "prefetch/x-web") {
			t.Errorf("namePrefix of the function's own kustomization: DaemonSet %s rendered for %q, want the instance x-web", o.GetName(), o.GetAnnotations()["image-prefetcher.stackrox.io/rendered-for"])
		}
	}
	for dir, want := range map[string]string{
		"copies": "DaemonSet prefetch/a-image-prefetcher-web and DaemonSet prefetch/b-image-prefetcher-web are both what image-prefetcher-fn rendered for ImagePrefetcher prefetch/web, renamed after rendering",
		"upper":  "ImagePrefetcher other/web has the name of ImagePrefetcher prefetch/web, which a lower layer rendered",
	} {
		if _, err := build(dir); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("kustomize build %s: %v, want a failure with %q", dir, err, want)
		}
	}
}
