// Package examples_test renders every shipped example and the kustomize
// overlays with the real tools users run (standalone kustomize, kpt, the
// Argo CD plugin's command and the Flux CI render step), compares each
// result with its golden file and applies it, as a server-side dry run, to a
// real kube-apiserver.
//
// Run with `make e2e`, or directly: go test ./tests/examples -run . -v
// (after `make build tools kube host-deps`). -update rewrites the golden files.
package examples_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

var update = flag.Bool("update", false, "rewrite the golden files with the current output")

// tools are the real binaries the tests run.
type tools struct {
	root      string // repository root
	bin       string // <root>/bin, first on PATH for every command
	kustomize string
	fn        string
	kpt       string
}

func findTools(t *testing.T) tools {
	t.Helper()
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(bin)
	tl := tools{root: root, bin: filepath.Join(root, "bin")}
	tl.kustomize = mustExecutable(t, filepath.Join(tl.bin, "kustomize"), "run `make tools` to install the standalone kustomize into ./bin")
	tl.fn = mustExecutable(t, filepath.Join(tl.bin, "image-prefetcher-fn"), "run `make build` to build the function into ./bin")
	kpt, err := exec.LookPath("kpt")
	if err != nil {
		t.Fatalf("kpt not found on PATH: install kpt v1 (https://kpt.dev/installation/kpt-cli/); the tests need the real `kpt fn render`")
	}
	tl.kpt = kpt
	return tl
}

func mustExecutable(t *testing.T, path, how string) string {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("%s is missing or not executable: %s", path, how)
	}
	return path
}

// env is the environment of every command: ./bin first on PATH, so that the
// bare command names used in the examples (kustomize, image-prefetcher-fn)
// resolve exactly as they would for a user who followed the README.
func (tl tools) env(extraPath ...string) []string {
	path := strings.Join(append(extraPath, tl.bin, os.Getenv("PATH")), string(os.PathListSeparator))
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "KUBECONFIG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+path)
}

// run executes argv in dir and returns stdout; stderr is included in the
// failure message because kustomize reports function errors only there.
func (tl tools) run(t *testing.T, dir string, env []string, argv ...string) []byte {
	t.Helper()
	out, err := tl.runErr(dir, env, argv...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

func (tl tools) runErr(dir string, env []string, argv ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prog, err := lookPathIn(argv[0], env)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, prog, argv[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s (in %s): %w\nstderr:\n%s", strings.Join(argv, " "), dir, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// lookPathIn resolves a bare command name with the PATH of env, as the
// shell or the tool that reads the example would; exec.Command alone would
// use the test process's PATH.
func lookPathIn(name string, env []string) (string, error) {
	if strings.ContainsRune(name, '/') {
		return name, nil
	}
	for _, kv := range env {
		path, ok := strings.CutPrefix(kv, "PATH=")
		if !ok {
			continue
		}
		for _, dir := range filepath.SplitList(path) {
			p := filepath.Join(dir, name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s: not found on the PATH of the command's environment", name)
}

// copyTree copies the directory src (relative to the repository root) into
// dst/<base of src>, the way a user copies an example, and returns the copy.
// Running from the copy proves that nothing reaches back into the checkout.
func (tl tools) copyTree(t *testing.T, src, dst string) string {
	t.Helper()
	from := filepath.Join(tl.root, src)
	to := filepath.Join(dst, filepath.Base(src))
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		target := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
	return to
}

// golden compares got with the file at rel (relative to the repository
// root), or rewrites the file when -update is set.
func (tl tools) golden(t *testing.T, rel string, got []byte) {
	t.Helper()
	path := filepath.Join(tl.root, rel)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run the test with -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run with -update if the change is intended):\n%s", rel, lineDiff(want, got))
	}
}

// goldenDir compares every file under gotDir with the tree at rel.
func (tl tools) goldenDir(t *testing.T, rel, gotDir string, skip func(name string) bool) {
	t.Helper()
	got := readTree(t, gotDir, skip)
	dir := filepath.Join(tl.root, rel)
	if *update {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		for name, data := range got {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	want := readTree(t, dir, skip)
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: missing from the output", filepath.Join(rel, name))
			continue
		}
		if !bytes.Equal(g, w) {
			t.Errorf("%s differs (run with -update if the change is intended):\n%s", filepath.Join(rel, name), lineDiff(w, g))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: in the output but not in the golden directory %s", name, rel)
		}
	}
}

func readTree(t *testing.T, dir string, skip func(string) bool) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if skip != nil && skip(rel) {
			return nil
		}
		files[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	return files
}

// lineDiff shows the first differing lines with a little context; enough to
// see what changed without a diff library.
func lineDiff(want, got []byte) string {
	w := strings.Split(string(want), "\n")
	g := strings.Split(string(got), "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	from := max(0, i-3)
	fmt.Fprintf(&b, "first difference at line %d\n", i+1)
	for j := from; j < i; j++ {
		fmt.Fprintf(&b, "    %s\n", w[j])
	}
	for j := i; j < min(len(w), i+6); j++ {
		fmt.Fprintf(&b, "  - %s\n", w[j])
	}
	for j := i; j < min(len(g), i+6); j++ {
		fmt.Fprintf(&b, "  + %s\n", g[j])
	}
	return b.String()
}

// readmeDocuments fails unless the README at rel shows cmd verbatim, so that
// the command a test runs is the command the user is told to run.
func (tl tools) readmeDocuments(t *testing.T, rel, cmd string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tl.root, rel))
	if err != nil {
		t.Errorf("read %s: %v", rel, err)
		return
	}
	if !strings.Contains(string(data), cmd) {
		t.Errorf("%s does not show the command the test runs:\n  %s", rel, cmd)
	}
}

// writeTree writes files (path relative to dir -> content) under dir,
// creating the directories they need.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
