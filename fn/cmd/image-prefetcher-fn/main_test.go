package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files from the current output")

// golden compares got with the file, or rewrites the file under -update.
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
		t.Fatalf("read golden file (run `go test ./fn/cmd/image-prefetcher-fn -update` to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -update if the change is intended):\n%s", file, diff(string(want), string(got)))
	}
}

// diff shows the first differing line with some context; enough to see
// what changed without a diff library.
func diff(want, got string) string {
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

type outcome struct {
	stdout, stderr []byte
	code           int
}

func invoke(t *testing.T, in []byte) outcome {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(bytes.NewReader(in), &out, &errb, nil)
	return outcome{out.Bytes(), errb.Bytes(), code}
}

// TestRender runs every testdata/render/*.in.yaml ResourceList through the
// function and compares stdout, stderr and the exit code with the goldens.
// Each output must also be a fixed point: the function run on its own
// output changes nothing.
func TestRender(t *testing.T) {
	inputs, err := filepath.Glob("testdata/render/*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs in testdata/render: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		t.Run(name, func(t *testing.T) {
			input, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			o := invoke(t, input)
			if o.code != 0 {
				t.Fatalf("exit code %d, stderr:\n%s", o.code, o.stderr)
			}
			base := strings.TrimSuffix(in, ".in.yaml")
			golden(t, base+".out.yaml", o.stdout)
			golden(t, base+".stderr", o.stderr)

			again := invoke(t, input)
			if !bytes.Equal(again.stdout, o.stdout) {
				t.Errorf("two runs on the same input differ:\n%s", diff(string(o.stdout), string(again.stdout)))
			}
			rerun := invoke(t, withoutResults(t, o.stdout))
			if rerun.code != 0 {
				t.Fatalf("rerun on own output: exit code %d, stderr:\n%s", rerun.code, rerun.stderr)
			}
			if !bytes.Equal(withoutResults(t, rerun.stdout), withoutResults(t, o.stdout)) {
				t.Errorf("not idempotent: running on its own output changed it:\n%s", diff(string(withoutResults(t, o.stdout)), string(withoutResults(t, rerun.stdout))))
			}
		})
	}
}

// withoutResults drops the results section: warnings about the input are
// not part of the rendered state an orchestrator feeds back.
func withoutResults(t *testing.T, out []byte) []byte {
	t.Helper()
	if i := bytes.Index(out, []byte("\nresults:\n")); i >= 0 {
		return out[:i+1]
	}
	return out
}
