package cli

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

// TestFatalErrorFollowsLogFormat: the error that ends a run is a plain line
// under --log-format text, and one JSON log line at error level under
// --log-format json, where a log pipeline parses every line.
func TestFatalErrorFollowsLogFormat(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	noSocket := []string{"fetch", "--cri-socket=" + missing, "--label-node=false", "x:1"}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantJSON bool
		want     string // in the message
		withCRI  bool   // add --cri-socket of the fake runtime
	}{
		{"text, missing socket", noSocket, ExitError, false, "CRI socket not found at " + missing + ":", false},
		{"text by default for an unknown format", []string{"fetch", "--log-format=xml"}, ExitUsage, false, `--log-format "xml"`, false},
		{"json, missing socket", append([]string{"--log-format=json"}, noSocket...), ExitError, true, "CRI socket not found at " + missing + ":", false},
		{"json, usage error", []string{"fetch", "--log-format=json", "--pull-policy=Sometimes", "--label-node=false"}, ExitUsage, true, "--pull-policy", false},
		// The parser stops at the unknown flag, before the logger is set
		// up, but after it has read --log-format.
		{"json, unknown flag", []string{"fetch", "--log-format=json", "--no-such-flag"}, ExitUsage, true, "unknown flag: --no-such-flag", false},
		{"json, bad log level", []string{"fetch", "--log-format=json", "--log-level=loud"}, ExitUsage, true, `--log-level "loud"`, false},
		{"json, --fail-on-error", []string{"fetch", "--log-format=json", "--fail-on-error", "--label-node=false", "typo:1"}, ExitImagesFailed, true, "1 of 1 images failed", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.cri.SetBehavior("docker.io/library/typo:1", func(context.Context, int, *runtimeapi.PullImageRequest) error {
				return fakecri.NotFound("docker.io/library/typo:1")
			})
			args := append([]string(nil), tt.args...)
			if tt.withCRI {
				args = append(args, "--cri-socket="+e.cri.Socket)
			}
			if code := e.run(args...); code != tt.wantCode {
				t.Fatalf("exit %d, want %d:\n%s", code, tt.wantCode, e.logs)
			}
			out := e.logs.String()
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			last := lines[len(lines)-1]
			if !tt.wantJSON {
				if !strings.HasPrefix(last, "image-prefetcher: ") || !strings.Contains(last, tt.want) {
					t.Errorf("last line %q, want a plain line with %q:\n%s", last, tt.want, out)
				}
				return
			}
			// Every line is JSON, the fatal one included.
			for _, l := range lines {
				if !json.Valid([]byte(l)) {
					t.Errorf("not a JSON line: %q", l)
				}
			}
			var rec struct {
				Level    string
				Msg      string
				ExitCode int
			}
			if err := json.Unmarshal([]byte(last), &rec); err != nil {
				t.Fatalf("last line %q: %v", last, err)
			}
			if rec.Level != "ERROR" || !strings.Contains(rec.Msg, tt.want) || rec.ExitCode != tt.wantCode {
				t.Errorf("last line %q: want level ERROR, a msg with %q and exitCode %d", last, tt.want, tt.wantCode)
			}
			if strings.Contains(out, "image-prefetcher: ") {
				t.Errorf("a plain line under --log-format json:\n%s", out)
			}
		})
	}
}
