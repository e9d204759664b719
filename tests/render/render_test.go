// Package render runs the function through the real orchestrators: the
// standalone kustomize binary (generator and transformer modes) and kpt.
package render

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files from the current output")

// repoRoot is the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// tool returns the path of a required executable or fails saying how to
// get it.
func tool(t *testing.T, path, how string) string {
	t.Helper()
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("%s is missing or not executable: %s", path, how)
	}
	return path
}

func fnBinary(t *testing.T) string {
	return tool(t, filepath.Join(repoRoot(t), "bin", "image-prefetcher-fn"), "run `make build`")
}

func kustomizeBinary(t *testing.T) string {
	return tool(t, filepath.Join(repoRoot(t), "bin", "kustomize"), "run `make tools` (installs kustomize v5.8.2 into ./bin)")
}

func kptBinary(t *testing.T) string {
	path, err := exec.LookPath("kpt")
	if err != nil {
		path = "/usr/bin/kpt"
	}
	return tool(t, path, "install kpt (https://kpt.dev/installation/) so that `kpt` is on PATH")
}

// copyTree copies testdata dir src to a temporary directory, replacing
// @FN@ with the function's absolute path.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	fn := fnBinary(t)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, bytes.ReplaceAll(b, []byte("@FN@"), []byte(fn)), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

type result struct {
	stdout, stderr []byte
	err            error
}

func run(t *testing.T, dir, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return result{out.Bytes(), errb.Bytes(), err}
}

func mustRun(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	r := run(t, dir, name, args...)
	if r.err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s", name, strings.Join(args, " "), r.err, r.stderr)
	}
	return r.stdout
}

func golden(t *testing.T, file string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read golden file (run `go test ./tests/render -update` to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -update if intended):\n%s", file, firstDiff(string(want), string(got)))
	}
}

func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  want: %q\n  got:  %q", i+1, wl, gl)
		}
	}
	return "(equal lines, different bytes)"
}

func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	return mustRun(t, dir, kustomizeBinary(t), "build", "--enable-alpha-plugins", "--enable-exec", ".")
}

// TestKustomizeGenerator: the ImagePrefetcher in `generators:`. kustomize
// adds the hash suffix to the ConfigMap and rewrites the DaemonSet's
// volume; the needs-hash annotation is consumed.
func TestKustomizeGenerator(t *testing.T) {
	dir := copyTree(t, "testdata/kustomize/generator")
	out := kustomizeBuild(t, dir)
	golden(t, "testdata/kustomize/generator.golden.yaml", out)
	if again := kustomizeBuild(t, dir); !bytes.Equal(again, out) {
		t.Errorf("two builds differ:\n%s", firstDiff(string(out), string(again)))
	}
	s := string(out)
	if strings.Contains(s, "needs-hash") || strings.Contains(s, "config.kubernetes.io/") || strings.Contains(s, "kind: ImagePrefetcher") {
		t.Errorf("function or config annotations, or the config itself, leaked into the output:\n%s", s)
	}
	if !strings.Contains(s, "      - configMap:\n          name: image-prefetcher-demo-") {
		t.Errorf("the DaemonSet does not mount the hash-suffixed ConfigMap:\n%s", s)
	}
}

// TestKustomizeTransformerOverlays: base-plus-overlays. Each overlay
// patches the ImagePrefetcher, sets its namespace (and a prefix), and runs
// the function last, as a transformer.
func TestKustomizeTransformerOverlays(t *testing.T) {
	root := copyTree(t, "testdata/kustomize/overlays")
	for _, env := range []string{"dev", "prod"} {
		t.Run(env, func(t *testing.T) {
			out := kustomizeBuild(t, filepath.Join(root, env))
			golden(t, "testdata/kustomize/overlay-"+env+".golden.yaml", out)
			s := string(out)
			if strings.Contains(s, "needs-hash") || strings.Contains(s, "config.kubernetes.io/") || strings.Contains(s, "kind: ImagePrefetcher") {
				t.Errorf("annotations or the ImagePrefetcher leaked into the output:\n%s", s)
			}
		})
	}
}

// TestKustomizeReportsErrors: kustomize shows only the function's stderr;
// it must name the object and the field.
func TestKustomizeReportsErrors(t *testing.T) {
	dir := copyTree(t, "testdata/kustomize/generator")
	p := filepath.Join(dir, "prefetcher.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(b, "  flavor: gke\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, dir, kustomizeBinary(t), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	if r.err == nil {
		t.Fatalf("build succeeded with an invalid flavor:\n%s", r.stdout)
	}
	want := `image-prefetcher-fn: error: ImagePrefetcher prefetch/demo: spec.flavor: "gke" is not supported: use vanilla, ocp or openshift`
	if !strings.Contains(string(r.stderr), want) {
		t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
	}
}

func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func names(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// kptRender runs `kpt fn render --allow-exec` from the repository root, so
// that the Kptfile's relative exec path ./bin/image-prefetcher-fn resolves.
func kptRender(t *testing.T, pkg string) {
	t.Helper()
	fnBinary(t)
	mustRun(t, repoRoot(t), kptBinary(t), "fn", "render", "--allow-exec", pkg)
}

// TestKptConfigPath: the ImagePrefetcher is the pipeline's configPath. It
// and the unrelated files stay byte for byte; the expansion lands in one
// new file; a second render changes nothing.
func TestKptConfigPath(t *testing.T) {
	pkg := copyTree(t, "testdata/kpt/config-path")
	before := readTree(t, pkg)
	kptRender(t, pkg)
	after := readTree(t, pkg)
	for name, b := range before {
		if !bytes.Equal(after[name], b) {
			t.Errorf("%s changed:\n%s", name, firstDiff(string(b), string(after[name])))
		}
	}
	if got, want := strings.Join(names(after), " "), "Kptfile image-prefetcher.prefetch.demo.yaml namespace.yaml prefetcher.yaml"; got != want {
		t.Fatalf("files after render: %s, want %s", got, want)
	}
	golden(t, "testdata/kpt/config-path.golden.yaml", after["image-prefetcher.prefetch.demo.yaml"])
	if s := string(after["image-prefetcher.prefetch.demo.yaml"]); strings.Contains(s, "needs-hash") || strings.Contains(s, "config.kubernetes.io/") {
		t.Errorf("config annotations in kpt output:\n%s", s)
	}

	kptRender(t, pkg)
	again := readTree(t, pkg)
	for name, b := range after {
		if !bytes.Equal(again[name], b) {
			t.Errorf("second render changed %s:\n%s", name, firstDiff(string(b), string(again[name])))
		}
	}
	if len(again) != len(after) {
		t.Errorf("second render changed the file set: %v", names(again))
	}
}

// TestKptMutator: no functionConfig; the ImagePrefetcher item stays, as the
// intent of the package, and its expansion is written next to it. It was
// not marked local-config, so the function marks it: that one annotation is
// the only change to the file.
func TestKptMutator(t *testing.T) {
	pkg := copyTree(t, "testdata/kpt/mutator")
	before := readTree(t, pkg)
	kptRender(t, pkg)
	after := readTree(t, pkg)
	if got, want := strings.Join(names(after), " "), "Kptfile image-prefetcher.prefetch.demo.yaml namespace.yaml prefetcher.yaml"; got != want {
		t.Fatalf("files after render: %s, want %s", got, want)
	}
	for _, name := range []string{"Kptfile", "namespace.yaml"} {
		if !bytes.Equal(after[name], before[name]) {
			t.Errorf("%s changed:\n%s", name, firstDiff(string(before[name]), string(after[name])))
		}
	}
	marked := strings.Replace(string(before["prefetcher.yaml"]), "  namespace: prefetch\n", "  namespace: prefetch\n  annotations:\n    config.kubernetes.io/local-config: 'true'\n", 1)
	if got := string(after["prefetcher.yaml"]); got != marked {
		t.Errorf("prefetcher.yaml after render:\n%s\nwant\n%s", got, marked)
	}
	golden(t, "testdata/kpt/mutator.golden.yaml", after["image-prefetcher.prefetch.demo.yaml"])

	kptRender(t, pkg)
	again := readTree(t, pkg)
	for name, b := range after {
		if !bytes.Equal(again[name], b) {
			t.Errorf("second render changed %s", name)
		}
	}
	if len(again) != len(after) {
		t.Errorf("second render changed the file set: %v", names(again))
	}
}
