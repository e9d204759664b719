package examples_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCurl stands for `curl -fsSLO URL` against a release: it logs the URL
// and copies the file of that name from $RELEASE_DIR, failing as curl -f
// does (exit 22) when the release has no such file.
const fakeCurl = `#!/bin/bash
set -eu
url="${@: -1}"
echo "$url" >> "$CURL_LOG"
f="$RELEASE_DIR/$(basename "$url")"
[ -f "$f" ] || { echo "curl: (22) 404 $url" >&2; exit 22; }
cp "$f" .
`

// TestFluxWorkflowsInstallTheReleasedFunction runs each Flux workflow's
// step that installs the function, exactly as written, against a release
// laid out as `make release` writes it (tests/release: the binaries
// image-prefetcher-fn_<os>_<arch> and SHA256SUMS in `sha256sum -c`'s
// format), served by a curl that reads a directory. The step installs the
// binary it downloaded from the release of IMAGE_PREFETCHER_VERSION only
// when its checksum is the release's.
func TestFluxWorkflowsInstallTheReleasedFunction(t *testing.T) {
	tl := findTools(t)
	ver := readVersion(t, tl)
	const bin = "image-prefetcher-fn_linux_amd64"
	content := []byte("the released function\n")
	sum := sha256.Sum256(content)
	good := hex.EncodeToString(sum[:]) + "  " + bin + "\n"
	otherSum := sha256.Sum256([]byte("another file"))
	other := hex.EncodeToString(otherSum[:]) + "  image-prefetcher-fn_darwin_arm64\n"
	cases := []struct {
		name      string
		binary    []byte
		sums      string
		installed bool
	}{
		{"the release's binary", content, other + good, true},
		{"a binary the sums do not match", []byte("tampered\n"), other + good, false},
		{"a binary the sums do not list", content, other, false},
	}
	for _, wfFile := range []string{fluxWorkflow, fluxStagedWorkflow} {
		var wf workflow
		readStrict(t, tl, wfFile, &wf)
		var step workflowStep
		for _, j := range wf.Jobs {
			for _, s := range j.Steps {
				if s.Name == "Install image-prefetcher-fn" {
					step = s
				}
			}
		}
		if step.Run == "" {
			t.Errorf("%s has no step \"Install image-prefetcher-fn\"", wfFile)
			continue
		}
		if got := wf.Env["IMAGE_PREFETCHER_VERSION"]; got != ver {
			t.Errorf("%s: IMAGE_PREFETCHER_VERSION %q, want VERSION %q", wfFile, got, ver)
		}
		for _, tc := range cases {
			t.Run(filepath.Base(wfFile)+"/"+tc.name, func(t *testing.T) {
				release, runner, tools := t.TempDir(), t.TempDir(), t.TempDir()
				write := func(path string, data []byte, mode os.FileMode) {
					t.Helper()
					if err := os.WriteFile(path, data, mode); err != nil {
						t.Fatal(err)
					}
				}
				write(filepath.Join(release, bin), tc.binary, 0o755)
				write(filepath.Join(release, "SHA256SUMS"), []byte(tc.sums), 0o644)
				write(filepath.Join(tools, "curl"), []byte(fakeCurl), 0o755)
				curlLog, ghPath := filepath.Join(runner, "curl.log"), filepath.Join(runner, "github_path")
				env := append(tl.env(tools), "RUNNER_TEMP="+runner, "GITHUB_PATH="+ghPath, "RELEASE_DIR="+release,
					"CURL_LOG="+curlLog, "IMAGE_PREFETCHER_VERSION="+ver)
				out, err := tl.runErr(t.TempDir(), env, "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step.Run)

				installed := filepath.Join(runner, "bin", "image-prefetcher-fn")
				got, readErr := os.ReadFile(installed)
				if !tc.installed {
					if err == nil || readErr == nil {
						t.Errorf("the step succeeded (%v) or installed the binary (%v); want it to fail first:\n%s", err, readErr, out)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, content) {
					t.Errorf("installed %q (%v), want the release's binary", got, readErr)
				}
				if fi, err := os.Stat(installed); err != nil || fi.Mode()&0o111 == 0 {
					t.Errorf("%s is not executable: %v", installed, err)
				}
				urls, _ := os.ReadFile(curlLog)
				base := "https://github.com/image-prefetcher/image-prefetcher/releases/download/v" + ver + "/"
				if want := base + bin + "\n" + base + "SHA256SUMS\n"; string(urls) != want {
					t.Errorf("downloaded\n%s\nwant\n%s", urls, want)
				}
				if p, _ := os.ReadFile(ghPath); !strings.Contains(string(p), filepath.Join(runner, "bin")) {
					t.Errorf("GITHUB_PATH %q does not add %s", p, filepath.Join(runner, "bin"))
				}
			})
		}
	}
}
