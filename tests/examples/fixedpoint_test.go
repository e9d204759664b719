package examples_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRenderAgainChangesNothing renders every example, and every golden
// input of tests/render, twice with the real tools: the second render
// changes no byte. Under kpt the package is rendered in place twice. Under
// kustomize the second render is the function run once more over the
// first's output, as a kustomization above it does; the result must be the
// first output itself.
func TestRenderAgainChangesNothing(t *testing.T) {
	tl := findTools(t)
	for _, kc := range kustomizeCases {
		t.Run("kustomize/"+kc.name, func(t *testing.T) {
			tmp := t.TempDir()
			tl.copyTree(t, kc.copy, tmp)
			dir := filepath.Join(tmp, kc.from)
			first := tl.run(t, dir, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", kc.target)
			above := t.TempDir()
			writeTree(t, above, map[string]string{
				"kustomization.yaml": "resources:\n- first.yaml\ntransformers:\n- fn.yaml\n",
				"first.yaml":         string(first),
				"fn.yaml":            execFunction,
			})
			second := tl.run(t, above, tl.env(), tl.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", ".")
			if !bytes.Equal(first, second) {
				t.Errorf("the function over its own output changed it:\n%s", lineDiff(first, second))
			}
		})
	}
	var packages []struct {
		name, dir string
		files     []string
	}
	seen := map[string]bool{}
	for _, kc := range kptCases {
		// The vanilla and ocp overlays share one package under kpt.
		if kc.wantErr == nil && !seen[kc.dir] {
			seen[kc.dir] = true
			packages = append(packages, struct {
				name, dir string
				files     []string
			}{kc.name, kc.dir, kc.files})
		}
	}
	for _, golden := range []string{"config-path", "mutator"} {
		dir := filepath.Join("tests/render/testdata/kpt", golden)
		entries, err := os.ReadDir(filepath.Join(tl.root, dir))
		if err != nil {
			t.Fatal(err)
		}
		var files []string
		for _, e := range entries {
			files = append(files, e.Name())
		}
		packages = append(packages, struct {
			name, dir string
			files     []string
		}{dir, dir, files})
	}
	for _, p := range packages {
		t.Run("kpt/"+p.name, func(t *testing.T) {
			pkg := filepath.Join(t.TempDir(), "pkg")
			files := map[string]string{"Kptfile": kptfileForExamples}
			for _, f := range p.files {
				// tests/render's Kptfiles name ./bin/image-prefetcher-fn.
				files[f] = strings.ReplaceAll(string(readFile(t, tl, filepath.Join(p.dir, f))), "./bin/image-prefetcher-fn", "image-prefetcher-fn")
			}
			writeTree(t, pkg, files)
			tl.run(t, pkg, tl.env(), tl.kpt, "fn", "render", "--allow-exec", pkg)
			once := readTree(t, pkg, nil)
			tl.run(t, pkg, tl.env(), tl.kpt, "fn", "render", "--allow-exec", pkg)
			twice := readTree(t, pkg, nil)
			for name, b := range once {
				if !bytes.Equal(twice[name], b) {
					t.Errorf("a second render changed %s:\n%s", name, lineDiff(b, twice[name]))
				}
			}
			if !slices.Equal(slices.Sorted(mapKeys(once)), slices.Sorted(mapKeys(twice))) {
				t.Errorf("a second render changed the files: %v, then %v", slices.Sorted(mapKeys(once)), slices.Sorted(mapKeys(twice)))
			}
		})
	}
}
