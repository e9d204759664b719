package examples_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
)

// The commands examples/kpt/README.md gives, run from examples/kpt.
const (
	kptRenderExec  = "kpt fn render --allow-exec exec -o rendered"
	kptRenderImage = "kpt fn render image -o rendered"
	kptSourceSink  = "kpt fn source exec | kpt fn eval - --exec image-prefetcher-fn | kpt fn sink rendered"
	kptReadme      = "examples/kpt/README.md"
	kptGolden      = "examples/kpt/expected"
)

func testKpt(t *testing.T, tl tools, api *apiServer) {
	isKptfile := func(name string) bool { return filepath.Base(name) == "Kptfile" }

	t.Run("render-exec", func(t *testing.T) {
		tl.readmeDocuments(t, kptReadme, kptRenderExec)
		dir := tl.copyTree(t, "examples/kpt", t.TempDir())
		tl.run(t, dir, tl.env(), append([]string{tl.kpt}, strings.Fields(kptRenderExec)[1:]...)...)
		out := filepath.Join(dir, "rendered")
		tl.goldenDir(t, kptGolden, out, nil)
		api.dryRunApply(t, concatYAML(t, out, isKptfile))
	})

	// kpt runs `image:` functions through a container runtime CLI. There is
	// no container engine here, so a stand-in `docker` on PATH plays the
	// engine: it checks that kpt asked for the released function image with
	// no network and as user nobody, and then runs the same static binary
	// the image holds in a fresh network namespace as uid 65534. What kpt
	// itself does (read the Kptfile, build and send the ResourceList, write
	// the files) is real.
	t.Run("render-image", func(t *testing.T) {
		tl.readmeDocuments(t, kptReadme, kptRenderImage)
		dir := tl.copyTree(t, "examples/kpt", t.TempDir())
		wantImage := version.FunctionImageRepository + ":" + readVersion(t, tl)
		if got := kptfileImage(t, filepath.Join(dir, "image", "Kptfile")); got != wantImage {
			t.Fatalf("examples/kpt/image/Kptfile runs %q, want the function image of this release %q", got, wantImage)
		}
		shim, log := dockerShim(t, tl, wantImage)
		tl.run(t, dir, tl.env(shim), append([]string{tl.kpt}, strings.Fields(kptRenderImage)[1:]...)...)
		calls, err := os.ReadFile(log)
		if err != nil || !strings.Contains(string(calls), "run ") {
			t.Fatalf("kpt never ran the function container (docker calls: %q, %v)", calls, err)
		}
		out := filepath.Join(dir, "rendered")
		tl.goldenDir(t, kptGolden, out, isKptfile)
		src, _ := os.ReadFile(filepath.Join(dir, "image", "Kptfile"))
		got, _ := os.ReadFile(filepath.Join(out, "Kptfile"))
		if string(src) != string(got) {
			t.Errorf("rendering changed the Kptfile:\n%s", lineDiff(src, got))
		}
	})

	t.Run("source-eval-sink", func(t *testing.T) {
		tl.readmeDocuments(t, kptReadme, kptSourceSink)
		dir := tl.copyTree(t, "examples/kpt", t.TempDir())
		tl.run(t, dir, tl.env(), "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", kptSourceSink)
		tl.goldenDir(t, kptGolden, filepath.Join(dir, "rendered"), nil)
	})
}

func readVersion(t *testing.T, tl tools) string {
	t.Helper()
	v, err := os.ReadFile(filepath.Join(tl.root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

func kptfileImage(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kf struct {
		Pipeline struct {
			Mutators []struct {
				Image string `json:"image"`
			} `json:"mutators"`
		} `json:"pipeline"`
	}
	if err := yaml.Unmarshal(data, &kf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(kf.Pipeline.Mutators) != 1 {
		t.Fatalf("%s: want exactly one mutator, got %d", path, len(kf.Pipeline.Mutators))
	}
	return kf.Pipeline.Mutators[0].Image
}

// dockerShim writes the stand-in docker CLI and returns its directory and
// the log of its calls.
func dockerShim(t *testing.T, tl tools, image string) (dir, log string) {
	t.Helper()
	dir = t.TempDir()
	log = filepath.Join(dir, "calls.log")
	script := fmt.Sprintf(`#!/bin/sh
echo "$*" >> %[1]q
case "$1" in
version) echo 28.2.2; exit 0 ;;
run) ;;
*) echo "docker stand-in: unexpected command: $*" >&2; exit 1 ;;
esac
args=" $* "
case "$args" in *" --network none "*) ;; *) echo "docker stand-in: kpt did not ask for --network none" >&2; exit 1 ;; esac
case "$args" in *" --user nobody "*) ;; *) echo "docker stand-in: kpt did not ask for --user nobody" >&2; exit 1 ;; esac
for last; do :; done
if [ "$last" != %[2]q ]; then echo "docker stand-in: unexpected image $last" >&2; exit 1; fi
exec unshare --net -- setpriv --reuid=65534 --regid=65534 --clear-groups -- %[3]q
`, log, image, tl.fn)
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, log
}

// concatYAML joins the YAML files of a rendered package into one stream.
func concatYAML(t *testing.T, dir string, skip func(string) bool) []byte {
	t.Helper()
	files := readTree(t, dir, skip)
	var b strings.Builder
	for _, n := range slices.Sorted(maps.Keys(files)) {
		b.WriteString("---\n")
		b.Write(files[n])
		if !strings.HasSuffix(string(files[n]), "\n") {
			b.WriteString("\n")
		}
	}
	return []byte(b.String())
}
