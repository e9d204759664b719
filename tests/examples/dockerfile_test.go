package examples_test

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
			env := append(tl.env(), "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH, "VERSION="+stampTest)
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
