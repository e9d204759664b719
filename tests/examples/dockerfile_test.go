package examples_test

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
)

// instruction is one Dockerfile instruction with its continuation lines
// joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, ...
	args string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out  []instruction
		cur  strings.Builder
		scan = bufio.NewScanner(f)
	)
	for scan.Scan() {
		line := strings.TrimSpace(scan.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue // a comment inside a continued instruction
		}
		if rest, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := scan.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The Dockerfiles cannot be built here (no container engine), so this test
// checks what can be checked without one: the final stage's base, user and
// entrypoint, and the build stage itself, run for real. The build stage's
// COPY instructions are replayed into an empty directory and its RUN
// commands executed there, which proves that the copied sources are enough,
// that the binary is static, and that it is stamped with VERSION exactly as
// `make build` stamps it.
func TestDockerfiles(t *testing.T) {
	const stampTest = "9.9.9-dockerfile-test"
	tl := findTools(t)
	ver := readVersion(t, tl)
	for _, tc := range []struct {
		file, binary, pkg, base, user string
	}{
		{"Dockerfile", "image-prefetcher", "./agent/cmd/image-prefetcher", "gcr.io/distroless/static-debian12", "0:0"},
		{"Dockerfile.fn", "image-prefetcher-fn", "./fn/cmd/image-prefetcher-fn", "gcr.io/distroless/static-debian12:nonroot", "65532:65532"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			ins := parseDockerfile(t, filepath.Join(tl.root, tc.file))
			var stages [][]instruction
			for _, in := range ins {
				if in.cmd == "FROM" {
					stages = append(stages, nil)
				}
				if len(stages) > 0 {
					stages[len(stages)-1] = append(stages[len(stages)-1], in)
				}
			}
			if len(stages) != 2 {
				t.Fatalf("want a build stage and a final stage, got %d stages", len(stages))
			}
			build, final := stages[0], stages[1]
			if !strings.Contains(build[0].args, "golang:1.26 ") {
				t.Errorf("build stage FROM %q, want golang:1.26", build[0].args)
			}
			if final[0].args != tc.base {
				t.Errorf("final stage FROM %q, want %q", final[0].args, tc.base)
			}
			dst := "/usr/local/bin/" + tc.binary
			var user, entrypoint string
			for _, in := range final[1:] {
				switch in.cmd {
				case "USER":
					user = in.args
				case "ENTRYPOINT":
					entrypoint = in.args
				case "RUN":
					t.Errorf("final stage runs %q; distroless has no shell", in.args)
				}
			}
			if user != tc.user {
				t.Errorf("USER %q, want %q", user, tc.user)
			}
			var ep []string
			if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || len(ep) != 1 || ep[0] != dst {
				t.Errorf("ENTRYPOINT %s, want exec form [%q]", entrypoint, dst)
			}

			// Replay the build stage.
			src := t.TempDir()
			// GOFLAGS empty, as in the golang image: the Makefile's
			// GOFLAGS must not stand in for the Dockerfile's own flags.
			env := append(tl.env(), "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH, "VERSION="+stampTest, "GOFLAGS=")
			out := filepath.Join(src, "out")
			for _, in := range build[1:] {
				switch in.cmd {
				case "WORKDIR", "ARG":
				case "COPY":
					fields := strings.Fields(in.args)
					for _, p := range fields[:len(fields)-1] {
						tl.copyTree(t, strings.TrimSuffix(p, "/"), filepath.Join(src, filepath.Dir(strings.TrimSuffix(p, "/"))))
					}
				case "RUN":
					if strings.Contains(in.args, "go build") && !strings.Contains(in.args, "${VERSION:-$(cat VERSION)}") {
						t.Errorf("the build must default to the VERSION file, as the Makefile does: %s", in.args)
					}
					script := strings.ReplaceAll(in.args, "/out/", out+"/")
					tl.run(t, src, env, "sh", "-ec", script)
				default:
					t.Fatalf("build stage instruction %s is not replayed by this test", in.cmd)
				}
			}
			bin := filepath.Join(out, tc.binary)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatalf("build stage did not produce %s: %v", bin, err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s is dynamically linked; distroless/static has no libc", tc.binary)
				}
			}
			// A build-arg VERSION must end up in version.Version, the variable
			// that also names the default agent image (-trimpath keeps
			// -ldflags out of the build info, so ask the binary).
			got, err := exec.Command(bin, "version").Output()
			if err != nil {
				t.Fatalf("%s version: %v", tc.binary, err)
			}
			if strings.TrimSpace(string(got)) != stampTest {
				t.Errorf("%s version printed %q, want the build-arg VERSION %q", tc.binary, got, stampTest)
			}
			info, err := exec.Command("go", "version", "-m", bin).Output()
			if err != nil {
				t.Fatal(err)
			}
			// Build tags follow the Makefile's (GO_BUILD_FLAGS).
			if tags := makeBuildTags(t, tl, tc.binary); tags != "" && !strings.Contains(string(info), "build\t-tags="+tags+"\n") {
				t.Errorf("make build uses -tags %s for %s, the Dockerfile does not:\n%s", tags, tc.binary, info)
			}
			if !strings.Contains(string(info), "CGO_ENABLED=0") || !strings.Contains(string(info), "path\tgithub.com/image-prefetcher/image-prefetcher/"+strings.TrimPrefix(tc.pkg, "./")+"\n") {
				t.Errorf("build info of %s: want package %s built without cgo:\n%s", tc.binary, tc.pkg, info)
			}
		})
	}

	// make images tags the agent image the function renders by default.
	t.Run("make-images", func(t *testing.T) {
		out := tl.run(t, tl.root, tl.env(), "make", "-n", "images")
		for _, want := range []string{
			"-f Dockerfile --build-arg VERSION=" + ver + " -t " + version.AgentImageRepository + ":" + ver + " .",
			"-f Dockerfile.fn --build-arg VERSION=" + ver + " -t " + version.FunctionImageRepository + ":" + ver + " .",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("make -n images does not run docker build %s:\n%s", want, out)
			}
		}
	})
}

// Release numbers written into examples and docs follow VERSION and the
// Makefile's kustomize, so that a release does not ship stale instructions.
func TestExampleVersions(t *testing.T) {
	tl := findTools(t)
	ver := readVersion(t, tl)
	mk, err := os.ReadFile(filepath.Join(tl.root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var kustomizeVersion string
	for _, line := range strings.Split(string(mk), "\n") {
		if k, v, ok := strings.Cut(line, ":="); ok && strings.TrimSpace(k) == "KUSTOMIZE_VERSION" {
			kustomizeVersion = strings.TrimSpace(v)
		}
	}
	if kustomizeVersion == "" {
		t.Fatal("Makefile has no KUSTOMIZE_VERSION")
	}
	fnImage := version.FunctionImageRepository + ":" + ver
	for file, wants := range map[string][]string{
		"examples/argocd/sidecar/Dockerfile": {"FROM " + fnImage + " AS fn", "kustomize/v5@" + kustomizeVersion},
		fluxWorkflow:                         {`IMAGE_PREFETCHER_VERSION: "` + ver + `"`, "KUSTOMIZE_VERSION: " + kustomizeVersion},
		fluxStagedWorkflow:                   {`IMAGE_PREFETCHER_VERSION: "` + ver + `"`, "KUSTOMIZE_VERSION: " + kustomizeVersion},
		"examples/kpt/README.md":             {fnImage},
		"docs/install.md":                    {"V=" + ver, "?ref=v" + ver},
		"docs/integrations.md":               {"kustomize/v5@" + kustomizeVersion, "?ref=v" + ver},
		"docs/integrations/kustomize.md":     {"?ref=v" + ver},
		"docs/integrations/kpt.md":           {fnImage},
	} {
		data, err := os.ReadFile(filepath.Join(tl.root, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range wants {
			if !strings.Contains(string(data), want) {
				t.Errorf("%s does not say %q", file, want)
			}
		}
	}
	// The sidecar carries both tools, as Argo CD's plugin user.
	ins := parseDockerfile(t, filepath.Join(tl.root, "examples/argocd/sidecar/Dockerfile"))
	var copies []string
	var user string
	for _, in := range ins {
		switch in.cmd {
		case "COPY":
			copies = append(copies, in.args)
		case "USER":
			user = in.args
		}
	}
	for _, bin := range []string{"/usr/local/bin/kustomize", "/usr/local/bin/image-prefetcher-fn"} {
		if !slices.ContainsFunc(copies, func(c string) bool { return strings.HasSuffix(c, " "+bin) }) {
			t.Errorf("sidecar image does not install %s (COPY lines: %q)", bin, copies)
		}
	}
	if user != "999:999" {
		t.Errorf("sidecar USER %q, want 999:999 (Argo CD runs plugin sidecars as 999)", user)
	}
}

// makeBuildTags returns the -tags value of the Makefile's GO_BUILD_FLAGS,
// which every go command of the Makefile builds with, or "".
func makeBuildTags(t *testing.T, tl tools, _ string) string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(tl.root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mk), "\n") {
		flags, ok := strings.CutPrefix(line, "GO_BUILD_FLAGS :=")
		if !ok {
			continue
		}
		f := strings.Fields(flags)
		for j, w := range f {
			if w == "-tags" && j+1 < len(f) {
				return f[j+1]
			}
			if v, ok := strings.CutPrefix(w, "-tags="); ok {
				return v
			}
		}
	}
	return ""
}
