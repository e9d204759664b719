package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

func writeList(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "images.txt")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFetchAllGood(t *testing.T) {
	e := newEnv(t)
	e.cri.AddImage("docker.io/library/pinned:1.0", 500)
	list := writeList(t, "\uFEFF# images\r\ndebian\r\npinned:1.0\n\nquay.io/x/y:2 # comment\ndebian:latest\n")
	if code := e.run(e.agentArgs("fetch", "--image-list-file="+list, "ghcr.io/extra/arg:3")...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	v, s, ok := e.state()
	if !ok || v != "succeeded" {
		t.Fatalf("label %q ok=%v", v, ok)
	}
	if s.Total != 4 || s.Present != 4 || len(s.Failed) != 0 || s.CompletedAt == "" {
		t.Errorf("summary %+v", s)
	}
	// The pinned, present image costs no pull; debian:latest is pulled once.
	if n := len(e.cri.Pulls("docker.io/library/pinned:1.0")); n != 0 {
		t.Errorf("present pinned image pulled %d times", n)
	}
	if n := len(e.cri.Pulls("docker.io/library/debian:latest")); n != 1 {
		t.Errorf("debian pulled %d times, want 1", n)
	}
	if !e.cri.HasImage("ghcr.io/extra/arg:3") {
		t.Error("image given as argument not pulled")
	}
	// Outside a pod there is nowhere to record an Event: skipped, said at debug.
	if !strings.Contains(e.logs.String(), "not recording an Event") {
		t.Errorf("no debug line about the skipped Event:\n%s", e.logs)
	}
	if !strings.Contains(e.logs.String(), "runtime=fakecri version=v1.0.0") {
		t.Errorf("runtime name and version not logged:\n%s", e.logs)
	}
	e.assertOthersUntouched()
}

func TestFetchRestartWithPinnedImagesSendsNoPulls(t *testing.T) {
	e := newEnv(t)
	list := writeList(t, "a.example.com/app:1\nb.example.com/db@sha256:"+strings.Repeat("a", 64)+"\n")
	for range 2 {
		if code := e.run(e.agentArgs("fetch", "--image-list-file="+list)...); code != 0 {
			t.Fatalf("exit %d, logs:\n%s", code, e.logs)
		}
	}
	if n := len(e.cri.Pulls("")); n != 2 {
		t.Errorf("%d pulls over two runs, want 2 (only the first run pulls)", n)
	}
}

func TestFetchPullPolicyAlways(t *testing.T) {
	e := newEnv(t)
	e.cri.AddImage("a.example.com/app:1", 1)
	if code := e.run(e.agentArgs("fetch", "--pull-policy=Always", "a.example.com/app:1")...); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if n := len(e.cri.Pulls("")); n != 1 {
		t.Errorf("%d pulls, want 1", n)
	}
}

func TestFetchNotFoundGivesUpAfterThreeAttempts(t *testing.T) {
	e := newEnv(t)
	ref := "docker.io/library/typo:1"
	e.cri.SetBehavior(ref, func(context.Context, int, *runtimeapi.PullImageRequest) error { return fakecri.NotFound(ref) })
	// The overall timeout is the default 20m: finishing at all proves that a
	// permanent error does not wait for it.
	if code := e.run(e.agentArgs("fetch", "typo:1", "good:1")...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	if n := len(e.cri.Pulls(ref)); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	v, s, _ := e.state()
	if v != "failed" || s.Total != 2 || s.Present != 1 || len(s.Failed) != 1 || s.Failed[0].Reason != pull.ReasonNotFound || s.Failed[0].Image != "typo:1" {
		t.Errorf("label %q summary %+v", v, s)
	}
	if !strings.Contains(s.Failed[0].Message, "not found") {
		t.Errorf("message %q", s.Failed[0].Message)
	}
	e.assertOthersUntouched()
}

func TestFetchFailOnError(t *testing.T) {
	e := newEnv(t)
	ref := "docker.io/library/typo:1"
	e.cri.SetBehavior(ref, func(context.Context, int, *runtimeapi.PullImageRequest) error { return fakecri.NotFound(ref) })
	if code := e.run(e.agentArgs("fetch", "--fail-on-error", "typo:1")...); code != ExitImagesFailed {
		t.Fatalf("exit %d, want %d", code, ExitImagesFailed)
	}
	if v, _, _ := e.state(); v != "failed" {
		t.Errorf("label %q: must be written before exiting", v)
	}
}

func TestFetchUnauthorizedTriesEachCredentialThenAnonymous(t *testing.T) {
	e := newEnv(t)
	ref := "registry.example.com:5000/team/app:1"
	e.cri.SetBehavior(ref, func(context.Context, int, *runtimeapi.PullImageRequest) error {
		return fakecri.HTTPStatus(ref, "registry.example.com:5000", "401 Unauthorized")
	})
	secret := "s3cr3t-Passw0rd"
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("robot:" + secret))
	if err := os.WriteFile(filepath.Join(dir, ".dockerconfigjson"), []byte(`{"auths":{"registry.example.com:5000":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(t.TempDir(), ".dockercfg")
	if err := os.WriteFile(legacy, []byte(`{"https://registry.example.com:5000/team":{"username":"other","password":"`+secret+`2"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code := e.run(e.agentArgs("fetch", "--log-format=json", "--docker-config="+dir, "--docker-config="+legacy, ref)...)
	if code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	calls := e.cri.Pulls(ref)
	if len(calls) != 9 {
		t.Fatalf("%d PullImage calls, want 3 attempts x (2 credentials + anonymous)", len(calls))
	}
	// Most specific key first, then the host key, then anonymous.
	for i, want := range []string{"other", "robot", ""} {
		a := calls[i].Auth
		if want == "" {
			if a != nil {
				t.Errorf("call %d: want anonymous, got user %q", i, a.GetUsername())
			}
			continue
		}
		if a.GetUsername() != want || a.GetServerAddress() != "https://registry.example.com:5000" {
			t.Errorf("call %d: user %q server %q", i, a.GetUsername(), a.GetServerAddress())
		}
	}
	_, s, _ := e.state()
	if len(s.Failed) != 1 || s.Failed[0].Reason != pull.ReasonUnauthorized {
		t.Errorf("summary %+v", s)
	}
	if strings.Contains(e.logs.String(), secret) || strings.Contains(e.logs.String(), auth) {
		t.Errorf("a secret was logged:\n%s", e.logs)
	}
	if !strings.Contains(e.logs.String(), "credential matches") {
		t.Errorf("expected debug logs about matching credentials:\n%s", e.logs)
	}
}

func TestFetchFlaky503ThenSuccess(t *testing.T) {
	e := newEnv(t)
	ref := "quay.io/org/flaky:1"
	e.cri.SetBehavior(ref, func(_ context.Context, n int, _ *runtimeapi.PullImageRequest) error {
		if n <= 5 {
			return fakecri.HTTPStatus(ref, "quay.io", "503 Service Unavailable")
		}
		return nil
	})
	if code := e.run(e.agentArgs("fetch", "--initial-pull-attempt-delay=1s", "--max-pull-attempt-delay=4s", ref)...); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if v, _, _ := e.state(); v != "succeeded" {
		t.Errorf("label %q", v)
	}
	if n := len(e.cri.Pulls(ref)); n != 6 {
		t.Errorf("%d attempts, want 6", n)
	}
	// Delays double to the maximum, each within ±20% of its nominal value.
	nominal := []float64{1, 2, 4, 4, 4}
	if len(e.sleeps) != len(nominal) {
		t.Fatalf("sleeps %v", e.sleeps)
	}
	for i, d := range e.sleeps {
		if s := d.Seconds(); s < 0.8*nominal[i] || s > 1.2*nominal[i] {
			t.Errorf("delay %d = %v, want %vs ±20%%", i, d, nominal[i])
		}
	}
}

func TestFetchStallThenRecoverWithLargerTimeout(t *testing.T) {
	e := newEnv(t)
	ref := "quay.io/org/slow:1"
	e.cri.SetBehavior(ref, func(ctx context.Context, n int, _ *runtimeapi.PullImageRequest) error {
		if n == 1 {
			return fakecri.Stall(ctx)
		}
		return nil
	})
	args := e.agentArgs("fetch", ref)
	args = append(args, "--initial-pull-attempt-timeout=200ms", "--max-pull-attempt-timeout=5m")
	if code := e.run(args...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	e.cri.Settle()
	calls := e.cri.Pulls(ref)
	if len(calls) != 2 {
		t.Fatalf("%d attempts, want 2", len(calls))
	}
	if calls[0].Err == nil || calls[1].Err != nil {
		t.Fatalf("errors %v, %v", calls[0].Err, calls[1].Err)
	}
	if calls[1].Timeout <= calls[0].Timeout {
		t.Errorf("second attempt's deadline %v is not larger than the first's %v", calls[1].Timeout, calls[0].Timeout)
	}
	if v, _, _ := e.state(); v != "succeeded" {
		t.Errorf("label %q", v)
	}
}

func TestFetchInvalidReferenceIsReportedNotAttempted(t *testing.T) {
	e := newEnv(t)
	list := writeList(t, "Bad::Ref\ngood:1\n")
	if code := e.run(e.agentArgs("fetch", "--image-list-file="+list)...); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if n := len(e.cri.Pulls("")); n != 1 {
		t.Errorf("%d pulls, want 1 (only the valid image)", n)
	}
	v, s, _ := e.state()
	if v != "failed" || s.Total != 2 || s.Present != 1 || len(s.Failed) != 1 || s.Failed[0].Reason != pull.ReasonInvalidReference || s.Failed[0].Image != "Bad::Ref" {
		t.Errorf("label %q summary %+v", v, s)
	}
}

func TestFetchRuntimeRestartMidRun(t *testing.T) {
	e := newEnv(t)
	ref := "quay.io/org/app:1"
	e.cri.SetBehavior(ref, func(ctx context.Context, n int, _ *runtimeapi.PullImageRequest) error {
		if n == 1 {
			// The runtime goes away while this pull is in flight, and
			// comes back.
			go func() {
				e.cri.Stop()
				if err := e.cri.Start(); err != nil {
					t.Error(err)
				}
			}()
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if code := e.run(e.agentArgs("fetch", ref)...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	if v, _, _ := e.state(); v != "succeeded" {
		t.Errorf("label %q, logs:\n%s", v, e.logs)
	}
}

func TestFetchMissingSocket(t *testing.T) {
	// A wrong criSocket mounted as a hostPath leaves an empty directory
	// at the path: it must fail as fast and as clearly as a missing one,
	// not after --cri-connect-timeout with "does not answer".
	dir := filepath.Join(t.TempDir(), "containerd.sock")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	missing, _ := filepath.Abs("does/not/exist.sock")
	tests := []struct {
		name, socket, wantPath, wantThere string
	}{
		{"missing", "does/not/exist.sock", missing, ""},
		{"directory", dir, dir, "a directory is there instead of a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			// Short, so that a run that reaches the runtime-version loop
			// fails with "does not answer" instead of waiting.
			args := []string{"fetch", "--cri-socket=" + tt.socket, "--cri-connect-timeout=1ms", "--label-node=false", "x:1"}
			if code := e.run(args...); code != ExitError {
				t.Fatalf("exit %d", code)
			}
			out := e.logs.String()
			if strings.Contains(out, "does not answer") {
				t.Errorf("the runtime was called:\n%s", out)
			}
			var line string
			for l := range strings.Lines(out) {
				if strings.Contains(l, "CRI socket not found") {
					line = l
				}
			}
			for _, want := range []string{"CRI socket not found at " + tt.wantPath + ":", "criSocket", tt.wantThere} {
				if !strings.Contains(line, want) {
					t.Errorf("no line with %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestFetchWithoutLabeling(t *testing.T) {
	e := newEnv(t)
	args := []string{"fetch", "--cri-socket=" + e.cri.Socket, "--label-node=false", "x:1"}
	if code := e.run(args...); code != 0 {
		t.Fatalf("exit %d, logs:\n%s", code, e.logs)
	}
	if len(e.kube.Actions()) != 0 {
		t.Errorf("API calls without labeling or a pod: %v", e.kube.Actions())
	}
}

func TestFetchRecordsEventOnOwnPod(t *testing.T) {
	tests := []struct {
		name       string
		images     []string
		wantType   string
		wantReason string
		wantMsg    string
	}{
		{"all present", []string{"x:1"}, corev1.EventTypeNormal, "Prefetched", "1/1 images present"},
		{"an image failed", []string{"x:1", "typo:1"}, corev1.EventTypeWarning, "PrefetchFailed", "1/2 images present in "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.cri.SetBehavior("docker.io/library/typo:1", func(context.Context, int, *runtimeapi.PullImageRequest) error {
				return fakecri.NotFound("docker.io/library/typo:1")
			})
			e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"], e.getenv["POD_UID"] = "prefetch-abc", "ns1", "uid-of-prefetch-abc"
			if code := e.run(e.agentArgs("fetch", tt.images...)...); code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			evs, err := e.kube.CoreV1().Events("ns1").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != 1 {
				t.Fatalf("%d events, want 1: %+v", len(evs.Items), evs.Items)
			}
			ev := evs.Items[0]
			if ev.Type != tt.wantType || ev.Reason != tt.wantReason || ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.Name != "prefetch-abc" || !strings.Contains(ev.Message, tt.wantMsg) {
				t.Errorf("event %s %s on %s/%s: %q", ev.Type, ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Message)
			}
			if ev.InvolvedObject.UID != "uid-of-prefetch-abc" {
				t.Errorf("involvedObject.uid = %q, want POD_UID", ev.InvolvedObject.UID)
			}
			if tt.wantType == corev1.EventTypeWarning && !strings.Contains(ev.Message, "typo:1 (NotFound)") {
				t.Errorf("warning does not name the failed image and reason: %q", ev.Message)
			}
		})
	}
}

func TestFetchUsageErrors(t *testing.T) {
	e := newEnv(t)
	sock := "--cri-socket=" + e.cri.Socket
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad pull policy", []string{"fetch", "--pull-policy=Sometimes", "--label-node=false"}, "--pull-policy"},
		{"unknown flag", []string{"fetch", "--no-such-flag"}, "unknown flag"},
		{"bad log format", []string{"fetch", "--log-format=xml", "--label-node=false"}, "--log-format"},
		// Labeling asked for explicitly cannot be done without knowing
		// where; left at its default, it is skipped instead (see
		// TestFetchReferenceManifest).
		{"labeling asked for without node and instance", []string{"fetch", sock, "--label-node=true"}, "--label-node needs --node-name (or NODE_NAME), --instance (or INSTANCE_NAME) and --namespace (or POD_NAMESPACE, or the service-account namespace file)"},
		{"labeling asked for as a bare flag", []string{"fetch", sock, "--label-node"}, "--label-node needs"},
		{"labeling asked for without instance", []string{"fetch", sock, "--label-node=true", "--node-name=" + testNode, "--namespace=" + testNamespace}, "--label-node needs --instance (or INSTANCE_NAME)\n"},
		{"labeling asked for without node", []string{"fetch", sock, "--label-node=true", "--instance=" + testInstance, "--namespace=" + testNamespace}, "--label-node needs --node-name (or NODE_NAME)\n"},
		// The namespace names the owner of the key (see agent/label's Owner).
		{"labeling asked for without namespace", []string{"fetch", sock, "--label-node=true", "--node-name=" + testNode, "--instance=" + testInstance}, "--label-node needs --namespace (or POD_NAMESPACE, or the service-account namespace file)\n"},
		{"non-positive image list timeout", []string{"fetch", sock, "--label-node=false", "--image-list-timeout=0s"}, "--image-list-timeout must be positive"},
		// Without a bin dir, a plugin name alone would be run from $PATH.
		{"credential provider config without bin dir", []string{"fetch", sock, "--label-node=false", "--image-credential-provider-config=" + writeList(t, "kind: CredentialProviderConfig\n")},
			"--image-credential-provider-config needs --image-credential-provider-bin-dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.logs = &syncBuffer{}
			if code := e.run(tt.args...); code != ExitUsage {
				t.Errorf("exit %d, want %d", code, ExitUsage)
			}
			if !strings.Contains(e.logs.String(), tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, e.logs)
			}
		})
	}
	if n := len(e.cri.Pulls("")); n != 0 {
		t.Errorf("%d pulls after usage errors", n)
	}
}

func TestFetchUnusablePullSecretIsSkipped(t *testing.T) {
	e := newEnv(t)
	if code := e.run(e.agentArgs("fetch", "--docker-config="+t.TempDir(), "--docker-config=/does/not/exist", "x:1")...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	if v, _, _ := e.state(); v != "succeeded" {
		t.Errorf("label %q", v)
	}
	if !strings.Contains(e.logs.String(), "pull secret unusable") {
		t.Errorf("logs:\n%s", e.logs)
	}
}

// TestFetchCredentialFallback: a 401 with one credential moves on to the
// next, then to anonymous, within one attempt, and success with any of
// them makes the image present.
func TestFetchCredentialFallback(t *testing.T) {
	const ref = "registry.example.com:5000/team/app:1"
	tests := []struct {
		name   string
		accept string   // the user the registry lets in; "" is anonymous
		want   []string // users of the PullImage calls in order; "" is anonymous
	}{
		{"first credential", "other", []string{"other"}},
		{"second credential after a 401", "robot", []string{"other", "robot"}},
		{"anonymous after two 401s", "", []string{"other", "robot", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.cri.SetBehavior(ref, func(_ context.Context, _ int, req *runtimeapi.PullImageRequest) error {
				if req.GetAuth().GetUsername() == tt.accept {
					return nil
				}
				return fakecri.HTTPStatus(ref, "registry.example.com:5000", "401 Unauthorized")
			})
			// The legacy file's key has a path, so it is the more specific
			// one and is tried first.
			dir := t.TempDir()
			auth := base64.StdEncoding.EncodeToString([]byte("robot:pw1"))
			if err := os.WriteFile(filepath.Join(dir, ".dockerconfigjson"), []byte(`{"auths":{"registry.example.com:5000":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
				t.Fatal(err)
			}
			legacy := filepath.Join(t.TempDir(), ".dockercfg")
			if err := os.WriteFile(legacy, []byte(`{"https://registry.example.com:5000/team":{"username":"other","password":"pw2"}}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if code := e.run(e.agentArgs("fetch", "--docker-config="+dir, "--docker-config="+legacy, ref)...); code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			calls := e.cri.Pulls(ref)
			var got []string
			for _, c := range calls {
				if c.Auth == nil {
					got = append(got, "")
					continue
				}
				if c.Auth.GetServerAddress() != "https://registry.example.com:5000" {
					t.Errorf("call with user %q: server address %q", c.Auth.GetUsername(), c.Auth.GetServerAddress())
				}
				got = append(got, c.Auth.GetUsername())
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("PullImage users %q, want %q", got, tt.want)
			}
			for i, c := range calls {
				if wantErr := i < len(calls)-1; (c.Err != nil) != wantErr {
					t.Errorf("call %d: err %v", i, c.Err)
				}
			}
			v, s, _ := e.state()
			if v != "succeeded" || s.Present != 1 || s.Total != 1 || len(s.Failed) != 0 || !e.cri.HasImage(ref) {
				t.Errorf("label %q summary %+v", v, s)
			}
		})
	}
}

// TestFetchLabelingFailureExitsNonZero: docs/agent.md, Exit codes: 1 when
// labeling failed, so that the kubelet runs fetch again.
func TestFetchLabelingFailureExitsNonZero(t *testing.T) {
	tests := []struct {
		name  string
		err   error // answer to every patch; nil: no reactor
		extra []string
	}{
		// Refused past the retry budget (a restarted apiserver refuses
		// for a while, so refusals are retried within it).
		{"forbidden", apierrors.NewForbidden(corev1.Resource("nodes"), testNode, errors.New("denied")), []string{"--label-retry-timeout=1ms"}},
		{"unavailable past the retry budget", apierrors.NewServiceUnavailable("etcd down"), []string{"--label-retry-timeout=1ms"}},
		{"node not found", nil, []string{"--node-name=ghost"}},
		// A labeling failure outranks --fail-on-error's 3: the run did
		// not finish.
		{"with --fail-on-error and a failed image", apierrors.NewForbidden(corev1.Resource("nodes"), testNode, errors.New("denied")), []string{"--fail-on-error", "--label-retry-timeout=1ms", "typo:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.cri.SetBehavior("docker.io/library/typo:1", func(context.Context, int, *runtimeapi.PullImageRequest) error {
				return fakecri.NotFound("docker.io/library/typo:1")
			})
			patches := 0
			e.kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				patches++
				if tt.err == nil {
					return false, nil, nil
				}
				return true, nil, tt.err
			})
			if code := e.run(e.agentArgs("fetch", append([]string{"x:1"}, tt.extra...)...)...); code != ExitError {
				t.Errorf("exit %d, want %d:\n%s", code, ExitError, e.logs)
			}
			// An unknown node fails the read of the key's owner, before
			// any patch.
			if tt.err != nil && patches == 0 {
				t.Error("no patch was attempted")
			}
			if tt.err == nil && !slices.ContainsFunc(e.kube.Actions(), func(a k8stesting.Action) bool {
				g, ok := a.(k8stesting.GetAction)
				return ok && a.GetResource().Resource == "nodes" && g.GetName() == "ghost"
			}) {
				t.Error("the node was never asked for")
			}
			if !strings.Contains(e.logs.String(), "labeling the node failed") {
				t.Errorf("logs:\n%s", e.logs)
			}
			if !e.cri.HasImage("docker.io/library/x:1") {
				t.Error("images were not pulled before labeling")
			}
		})
	}
}

// TestFetchHerdControl: with --max-concurrent-nodes, fetch pulls only while
// it holds a slot Lease, and gives it back; with nothing to pull it takes
// none. The gate is the production one (agent/slots) on the fake API.
func TestFetchHerdControl(t *testing.T) {
	const ns, pod = "prefetch", "prefetch-abc"
	tests := []struct {
		name     string
		flags    []string
		present  bool // the images are already there
		wantSlot string
		wantSeed bool
	}{
		{"one slot", []string{"--max-concurrent-nodes=1"}, false, "demo-slot-0", false},
		// Until a seed finishes, only slot 0 may be taken.
		{"seed node", []string{"--max-concurrent-nodes=3", "--seed-nodes=1"}, false, "demo-slot-0", true},
		{"everything present", []string{"--max-concurrent-nodes=1"}, true, "", false},
	}
	images := []string{"quay.io/org/app:1", "quay.io/org/db:2"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			enforceLeaseVersions(e.kube)
			e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = pod, ns
			var mu sync.Mutex
			holders := map[string]string{} // image -> slot holder seen during its pull
			for _, ref := range images {
				if tt.present {
					e.cri.AddImage(ref, 1)
				}
				e.cri.SetBehavior(ref, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
					l, err := e.kube.CoordinationV1().Leases(ns).Get(ctx, tt.wantSlot, metav1.GetOptions{})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						holders[ref] = "error: " + err.Error()
						return nil
					}
					holders[ref] = ptr.Deref(l.Spec.HolderIdentity, "")
					return nil
				})
			}
			if code := e.run(e.agentArgs("fetch", append(tt.flags, images...)...)...); code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			if v, _, _ := e.state(); v != "succeeded" {
				t.Errorf("label %q", v)
			}
			if tt.wantSlot == "" {
				for _, a := range e.kube.Actions() {
					if a.GetResource().Resource == "leases" {
						t.Errorf("Lease call with nothing to pull: %s %s", a.GetVerb(), a.GetResource().Resource)
					}
				}
				if len(e.cri.Pulls("")) != 0 {
					t.Errorf("%d pulls of present images", len(e.cri.Pulls("")))
				}
				return
			}
			leases, err := e.kube.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, ref := range images {
				if h := holders[ref]; !strings.HasPrefix(h, pod+"-") {
					t.Errorf("%s pulled while %s was held by %q, want this pod", ref, tt.wantSlot, h)
				}
			}
			if len(leases.Items) != 1 || leases.Items[0].Name != tt.wantSlot {
				t.Fatalf("leases %+v, want only %s", leases.Items, tt.wantSlot)
			}
			l := leases.Items[0]
			if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
				t.Errorf("slot still held by %q after fetch: not released", h)
			}
			seeded := l.Annotations[slots.SeededAnnotation]
			wantSeed := ""
			if tt.wantSeed {
				wantSeed = loadList("", images).Digest()
			}
			if seeded != wantSeed {
				t.Errorf("seeded annotation %q, want %q", seeded, wantSeed)
			}
		})
	}
}

// enforceLeaseVersions gives the fake clientset what the API server has and
// the fake lacks, and what agent/slots relies on: a resourceVersion that
// changes on every Lease write, and a conflict for an update that carries a
// stale one. Without it, a release would silently overwrite the seed mark.
func enforceLeaseVersions(cs *fake.Clientset) {
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	var mu sync.Mutex
	rv := 0
	next := func() string {
		mu.Lock()
		defer mu.Unlock()
		rv++
		return strconv.Itoa(rv)
	}
	cs.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		l.ResourceVersion = next()
		if err := cs.Tracker().Create(gvr, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l, nil
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := cs.Tracker().Get(gvr, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		if cur.(*coordinationv1.Lease).ResourceVersion != l.ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name, errors.New("the object has been modified"))
		}
		l.ResourceVersion = next()
		if err := cs.Tracker().Update(gvr, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l, nil
	})
}
