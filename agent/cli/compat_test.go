package cli

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// TestFetchReferenceManifest runs fetch the way the reference agent's
// DaemonSet does (stackrox/image-prefetcher, deploy/deployment.yaml.gotpl):
// its flags only, no NODE_NAME, INSTANCE_NAME, POD_NAME or POD_NAMESPACE,
// and no API access. It must pull the list and exit 0 without labeling.
func TestFetchReferenceManifest(t *testing.T) {
	const private = "registry.example.com/team/app:1"
	tests := []struct {
		name        string
		extra       []string
		wantSkip    bool     // the one warning that labeling is skipped
		wantLogs    []string // in the logs
		wantNotices []string // cobra's deprecation notices, on stdout
		wantDebug   bool
	}{
		{name: "plain", wantSkip: true},
		{name: "debug", extra: []string{"--debug"}, wantSkip: true, wantDebug: true,
			wantNotices: []string{"Flag --debug has been deprecated, use --log-level=debug"}},
		{name: "explicit log level wins over debug", extra: []string{"--debug", "--log-level=info"}, wantSkip: true},
		{name: "image list timeout", extra: []string{"--image-list-timeout=30s"}, wantSkip: true,
			wantNotices: []string{"Flag --image-list-timeout has been deprecated, it now bounds each ImageStatus call"}},
		{name: "metrics endpoint", extra: []string{"--metrics-endpoint=demo-metrics:8443"}, wantSkip: true,
			wantLogs:    []string{"--metrics-endpoint is ignored", "--metrics-addr", "metricsEndpoint=demo-metrics:8443"},
			wantNotices: []string{"Flag --metrics-endpoint has been deprecated, it is ignored", "--metrics-addr"}},
		{name: "all of them", extra: []string{"--metrics-endpoint=demo-metrics:8443", "--image-list-timeout=1m", "--debug"}, wantSkip: true, wantDebug: true,
			wantLogs:    []string{"--metrics-endpoint is ignored"},
			wantNotices: []string{"Flag --debug has been deprecated", "Flag --image-list-timeout has been deprecated", "Flag --metrics-endpoint has been deprecated"}},
		{name: "labeling turned off explicitly: no warning", extra: []string{"--label-node=false"}, wantSkip: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			// The reference mounts the pull secret's directory and passes
			// the file.
			dir := t.TempDir()
			auth := base64.StdEncoding.EncodeToString([]byte("robot:s3cr3t"))
			secret := filepath.Join(dir, ".dockerconfigjson")
			if err := os.WriteFile(secret, []byte(`{"auths":{"registry.example.com":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
				t.Fatal(err)
			}
			list := writeList(t, "debian:12\n"+private+"\n")
			args := append([]string{"fetch", "--docker-config=" + secret, "--image-list-file=" + list, "--cri-socket=" + e.cri.Socket}, tt.extra...)

			deps := e.deps()
			var kubeCalls int
			deps.Kube = func(string) (kube.Interface, error) {
				kubeCalls++
				return nil, os.ErrPermission
			}
			if code := Execute(context.Background(), args, deps); code != 0 {
				t.Fatalf("exit %d, logs:\n%s\nstdout:\n%s", code, e.logs, e.stdout)
			}
			if kubeCalls != 0 || len(e.kube.Actions()) != 0 {
				t.Errorf("API client built %d times, %d API calls: the reference manifest grants no API access", kubeCalls, len(e.kube.Actions()))
			}
			for _, ref := range []string{"docker.io/library/debian:12", private} {
				if !e.cri.HasImage(ref) {
					t.Errorf("%s not pulled", ref)
				}
			}
			if calls := e.cri.Pulls(private); len(calls) != 1 || calls[0].Auth.GetUsername() != "robot" {
				t.Errorf("private image pulls %+v: want one, with the pull secret's credential", calls)
			}
			if _, has := e.node(testNode).Labels[testKey]; has {
				t.Error("a node was labeled")
			}
			logs := e.logs.String()
			if n := strings.Count(logs, "not labeling the node"); tt.wantSkip && n != 1 || !tt.wantSkip && n != 0 {
				t.Errorf("%d warnings about skipped labeling, want %v:\n%s", n, tt.wantSkip, logs)
			}
			if tt.wantSkip && !strings.Contains(logs, "--node-name (or NODE_NAME), --instance (or INSTANCE_NAME) and --namespace (or POD_NAMESPACE, or the service-account namespace file) unset") {
				t.Errorf("the warning does not say what is missing:\n%s", logs)
			}
			for _, want := range tt.wantLogs {
				if !strings.Contains(logs, want) {
					t.Errorf("logs lack %q:\n%s", want, logs)
				}
			}
			for _, want := range tt.wantNotices {
				if !strings.Contains(e.stdout.String(), want) {
					t.Errorf("no notice %q:\n%s", want, e.stdout)
				}
			}
			if got := strings.Contains(logs, "level=DEBUG"); got != tt.wantDebug {
				t.Errorf("debug logs %v, want %v:\n%s", got, tt.wantDebug, logs)
			}
		})
	}
}

// The reference flags are hidden: the help shows the current ones only.
func TestReferenceFlagsHidden(t *testing.T) {
	for _, sub := range []string{"fetch", "watch"} {
		t.Run(sub, func(t *testing.T) {
			e := newEnv(t)
			if code := e.run(sub, "--help"); code != 0 {
				t.Fatalf("exit %d", code)
			}
			help := e.stdout.String()
			if !strings.Contains(help, "--metrics-addr") {
				t.Fatalf("help lacks --metrics-addr:\n%s", help)
			}
			for _, hidden := range []string{"--debug", "--image-list-timeout", "--metrics-endpoint"} {
				if strings.Contains(help, hidden) {
					t.Errorf("help shows %s", hidden)
				}
			}
		})
	}
}

// slowRuntime answers ImageStatus only when the caller's context ends, and
// records the deadlines it was given.
type slowRuntime struct {
	mu        sync.Mutex
	deadlines map[string]time.Time
}

func (r *slowRuntime) record(ctx context.Context, call string) {
	dl, _ := ctx.Deadline()
	r.mu.Lock()
	r.deadlines[call] = dl
	r.mu.Unlock()
}

func (r *slowRuntime) ImageStatus(ctx context.Context, _ string) (*cri.ImageInfo, error) {
	r.record(ctx, "ImageStatus")
	<-ctx.Done()
	return nil, ctx.Err()
}

func (r *slowRuntime) PullImage(ctx context.Context, _ string, _ *cri.Auth) (string, error) {
	r.record(ctx, "PullImage")
	return "sha256:x", nil
}

func TestStatusBound(t *testing.T) {
	r := &slowRuntime{deadlines: map[string]time.Time{}}
	b := statusBound{Runtime: r, timeout: 20 * time.Millisecond}
	before := time.Now()
	if _, err := b.ImageStatus(context.Background(), "x:1"); err != context.DeadlineExceeded {
		t.Errorf("ImageStatus: %v, want the bound's deadline", err)
	}
	if dl := r.deadlines["ImageStatus"]; dl.IsZero() || dl.Before(before) || dl.After(time.Now()) {
		t.Errorf("ImageStatus deadline %v", dl)
	}
	// Pulls keep the deadlines the puller gives them.
	if _, err := b.PullImage(context.Background(), "x:1", nil); err != nil {
		t.Fatal(err)
	}
	if dl := r.deadlines["PullImage"]; !dl.IsZero() {
		t.Errorf("PullImage got deadline %v from the status bound", dl)
	}
}
