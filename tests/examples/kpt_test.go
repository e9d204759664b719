package examples_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
)

// The commands examples/kpt/README.md gives, run from examples/kpt.
const (
	kptRenderInPlace = "kpt fn render --allow-exec exec\n"
	kptRenderExec    = "kpt fn render --allow-exec exec -o rendered"
	kptRenderImage   = "KPT_FN_RUNTIME=podman kpt fn render image -o rendered"
	kptSourceSink    = "kpt fn source exec | kpt fn eval - --exec image-prefetcher-fn | kpt fn sink rendered"
	kptReadme        = "examples/kpt/README.md"
	kptGolden        = "examples/kpt/expected"
)

func testKpt(t *testing.T, tl tools, api *apiServer) {
	isKptfile := func(name string) bool { return filepath.Base(name) == "Kptfile" }

	// The workflow the README shows first: render in place, commit, kpt
	// live apply. The package after the render is the golden; what kpt
	// live apply would send (everything but local-config) passes the
	// apiserver.
	t.Run("render-in-place", func(t *testing.T) {
		tl.readmeDocuments(t, kptReadme, kptRenderInPlace)
		dir := tl.copyTree(t, "examples/kpt", t.TempDir())
		tl.run(t, dir, tl.env(), append([]string{tl.kpt}, strings.Fields(kptRenderInPlace)[1:]...)...)
		pkg := filepath.Join(dir, "exec")
		tl.goldenDir(t, kptGolden, pkg, nil)
		api.dryRunApply(t, concatYAML(t, pkg, isKptfile))
	})

	t.Run("render-exec", func(t *testing.T) {
		tl.readmeDocuments(t, kptReadme, kptRenderExec)
		dir := tl.copyTree(t, "examples/kpt", t.TempDir())
		tl.run(t, dir, tl.env(), append([]string{tl.kpt}, strings.Fields(kptRenderExec)[1:]...)...)
		out := filepath.Join(dir, "rendered")
		tl.goldenDir(t, kptGolden, out, nil)
		api.dryRunApply(t, concatYAML(t, out, isKptfile))
	})

	// kpt runs `image:` functions through a container runtime CLI. There is
	// no Docker engine here, but podman needs none: kpt runs the function
	// image this build made (`make oci`) through real podman and runc, as
	// its README shows. A logging wrapper in front of podman records what
	// kpt asked for (no network, user nobody, this release's image).
	t.Run("render-image", func(t *testing.T) {
		tl.readmeDocuments(t, kptReadme, kptRenderImage)
		dir := tl.copyTree(t, "examples/kpt", t.TempDir())
		wantImage := version.FunctionImageRepository + ":" + readVersion(t, tl)
		if got := kptfileImage(t, filepath.Join(dir, "image", "Kptfile")); got != wantImage {
			t.Fatalf("examples/kpt/image/Kptfile runs %q, want the function image of this release %q", got, wantImage)
		}
		pm := newPodman(t, tl)
		pm.load(t, tl, filepath.Join(tl.root, "out", "oci", "image-prefetcher-fn"), wantImage)
		tl.run(t, dir, pm.env, "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", kptRenderImage)
		runs := pm.runs(t)
		if len(runs) != 1 {
			t.Fatalf("kpt ran %d function containers, want 1 (podman calls: %q)", len(runs), runs)
		}
		for _, want := range []string{" --network none ", " --user nobody "} {
			if !strings.Contains(" "+runs[0]+" ", want) {
				t.Errorf("kpt ran the function without%s: podman %s", strings.TrimSuffix(want, " "), runs[0])
			}
		}
		args := strings.Fields(runs[0])
		if last := args[len(args)-1]; last != wantImage {
			t.Errorf("kpt ran image %q, want %q", last, wantImage)
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

// podman is a podman with storage, state and configuration of its own in a
// temporary directory, so a test neither sees nor leaves images on the host.
type podman struct {
	bin string   // the real podman
	dir string   // its private root
	env []string // for kpt: the private config, the wrapper first on PATH
	log string   // the arguments of every podman call kpt made
}

func newPodman(t *testing.T, tl tools) *podman {
	t.Helper()
	bin, err := exec.LookPath("podman")
	if err != nil {
		t.Fatalf("podman not found on PATH: `make host-deps` installs it (apt-get install podman); kpt runs `image:` functions through it")
	}
	dir := t.TempDir()
	pm := &podman{bin: bin, dir: dir, log: filepath.Join(dir, "calls.log")}
	// runc sets a container's rlimits from podman's defaults, which raise
	// nofile and nproc; without CAP_SYS_RESOURCE in the bounding set (as on
	// this machine kind) that fails, so the limits are modest fixed values.
	// cgroupfs and a file event log: there is no systemd or journald.
	files := map[string]string{
		"storage.conf": fmt.Sprintf("[storage]\ndriver = \"overlay\"\ngraphroot = %q\nrunroot = %q\n",
			filepath.Join(dir, "root"), filepath.Join(dir, "run")),
		"containers.conf": fmt.Sprintf(`[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
log_driver = "k8s-file"
[network]
network_config_dir = %q
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = %q
volume_path = %q
`, filepath.Join(dir, "net"), filepath.Join(dir, "tmp"), filepath.Join(dir, "volumes")),
		"wrapper/podman": fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %q\nexec %q \"$@\"\n", pm.log, bin),
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pm.env = append(tl.env(filepath.Join(dir, "wrapper")),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"))
	// Before t.TempDir's removal: podman's overlay mounts must be gone.
	t.Cleanup(func() {
		if _, err := tl.runErr(dir, pm.env, bin, "rmi", "--all", "--force"); err != nil {
			t.Error(err)
		}
	})
	return pm
}

// load puts an OCI layout into podman's storage under ref, where kpt's
// `--pull missing` finds it instead of going to the registry.
func (pm *podman) load(t *testing.T, tl tools, layout, ref string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
		t.Fatalf("no OCI layout at %s (run `make oci`): %v", layout, err)
	}
	id := tl.run(t, pm.dir, pm.env, pm.bin, "pull", "--quiet", "oci:"+layout)
	tl.run(t, pm.dir, pm.env, pm.bin, "tag", strings.TrimSpace(string(id)), ref)
	if err := os.Remove(pm.log); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// runs returns the arguments of each `podman run` kpt made.
func (pm *podman) runs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(pm.log)
	if err != nil {
		t.Fatalf("kpt never called podman: %v", err)
	}
	var runs []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(line, "run ") {
			runs = append(runs, line)
		}
	}
	return runs
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
