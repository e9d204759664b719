package pull

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/creds"
	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

// authRuntime answers 401 to every pull that does not carry user "u".
type authRuntime struct {
	mu    sync.Mutex
	auths []string // the user of each PullImage call, "" for anonymous
}

func (*authRuntime) ImageStatus(context.Context, string) (*cri.ImageInfo, error) { return nil, nil }

func (m *authRuntime) PullImage(_ context.Context, ref string, a *cri.Auth) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	user := ""
	if a != nil {
		user = a.Username
	}
	m.auths = append(m.auths, user)
	if user != "u" {
		return "", fakecri.HTTPStatus(ref, "r.example.com", "401 Unauthorized")
	}
	return "sha256:x", nil
}

// An exec plugin that fails once (IMDS or STS throttling) is asked again at
// the next attempt, as the kubelet would, instead of every retry going out
// anonymous and the image ending Unauthorized.
func TestCredentialsAreLookedUpForEachAttempt(t *testing.T) {
	bin := t.TempDir()
	marker := filepath.Join(bin, "ran-once")
	script := "#!/bin/sh\ncat >/dev/null\nif [ ! -e " + marker + " ]; then touch " + marker + "; echo throttled >&2; exit 1; fi\n" +
		`echo '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"1h","auth":{"r.example.com":{"username":"u","password":"p"}}}'` + "\n"
	if err := os.WriteFile(filepath.Join(bin, "flaky"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("kind: CredentialProviderConfig\napiVersion: kubelet.config.k8s.io/v1\nproviders:\n- name: flaky\n  matchImages: [r.example.com]\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plugins, err := creds.LoadProviderConfig(cfg, bin)
	if err != nil {
		t.Fatal(err)
	}
	rt := &authRuntime{}
	p := New(rt, Config{Creds: &creds.Provider{Plugins: plugins, Log: discard}, Log: discard, OverallTimeout: guard,
		Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
	res := p.Run(context.Background(), entries("r.example.com/team/app:1"), "")
	if !res[0].Present {
		t.Errorf("%+v, want pulled with the plugin's credential at the second attempt", res[0])
	}
	// Attempt 1: the plugin failed, anonymous only. Attempt 2: the plugin's
	// credential, which works.
	if want := []string{"", "u"}; len(rt.auths) != 2 || rt.auths[0] != want[0] || rt.auths[1] != want[1] {
		t.Errorf("pulls carried users %q, want %q", rt.auths, want)
	}
}
