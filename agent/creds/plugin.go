package creds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

// The kubelet's credential-provider API, reduced to the fields used here.
const (
	ProviderAPIVersion = "credentialprovider.kubelet.k8s.io/v1"
	configKind         = "CredentialProviderConfig"
)

// ProviderConfig is the kubelet's CredentialProviderConfig file.
type ProviderConfig struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Providers  []ProviderSpec `json:"providers"`
}

// ProviderSpec is one exec plugin.
type ProviderSpec struct {
	Name                 string   `json:"name"`
	MatchImages          []string `json:"matchImages"`
	DefaultCacheDuration string   `json:"defaultCacheDuration"`
	APIVersion           string   `json:"apiVersion"`
	Args                 []string `json:"args"`
	Env                  []EnvVar `json:"env"`
}

// EnvVar is a name/value pair passed to the plugin.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type providerRequest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Image      string `json:"image"`
}

type providerAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

type providerResponse struct {
	APIVersion    string                  `json:"apiVersion"`
	Kind          string                  `json:"kind"`
	CacheKeyType  string                  `json:"cacheKeyType"`
	CacheDuration string                  `json:"cacheDuration"`
	Auth          map[string]providerAuth `json:"auth"`
}

// LoadProviderConfig reads a CredentialProviderConfig (YAML or JSON) and
// returns one Plugin per provider, each run from binDir.
func LoadProviderConfig(path, binDir string) ([]*Plugin, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read credential provider config: %w", err)
	}
	var cfg ProviderConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("decode credential provider config %s: %w", path, err)
	}
	if cfg.Kind != configKind {
		return nil, fmt.Errorf("credential provider config %s: kind is %q, want %s", path, cfg.Kind, configKind)
	}
	var out []*Plugin
	for _, p := range cfg.Providers {
		if p.Name == "" || strings.ContainsRune(p.Name, '/') {
			return nil, fmt.Errorf("credential provider config %s: invalid provider name %q", path, p.Name)
		}
		if len(p.MatchImages) == 0 {
			return nil, fmt.Errorf("credential provider %s: matchImages is empty", p.Name)
		}
		var def time.Duration
		if p.DefaultCacheDuration != "" {
			if def, err = time.ParseDuration(p.DefaultCacheDuration); err != nil {
				return nil, fmt.Errorf("credential provider %s: defaultCacheDuration: %w", p.Name, err)
			}
		}
		if p.APIVersion == "" {
			p.APIVersion = ProviderAPIVersion
		}
		out = append(out, &Plugin{Spec: p, Bin: filepath.Join(binDir, p.Name), DefaultCacheDuration: def, cache: map[string]cacheEntry{}})
	}
	return out, nil
}

// DefaultPluginTimeout bounds one run of a credential plugin.
const DefaultPluginTimeout = time.Minute

// pluginWaitDelay is how long the output pipes stay open after the plugin
// exited or was killed.
const pluginWaitDelay = 2 * time.Second

// killGroup kills the plugin's process group: the plugin and every child
// that did not leave the group.
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// Plugin runs one kubelet credential-provider exec plugin and caches its
// answers as the response asks.
type Plugin struct {
	Spec                 ProviderSpec
	Bin                  string
	DefaultCacheDuration time.Duration
	// Timeout bounds one run of the plugin (DefaultPluginTimeout when 0).
	Timeout time.Duration
	// Now is the clock; tests replace it.
	Now func() time.Time

	mu    sync.Mutex
	cache map[string]cacheEntry
}

type cacheEntry struct {
	keyring *Keyring
	expires time.Time
}

// Matches reports whether the plugin applies to image (schemeless, without
// tag or digest).
func (p *Plugin) Matches(repo string) bool {
	for _, m := range p.Spec.MatchImages {
		if URLsMatch(m, repo) {
			return true
		}
	}
	return false
}

func (p *Plugin) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Lookup returns the plugin's credentials for image; nil when it does not
// apply.
func (p *Plugin) Lookup(ctx context.Context, image string) ([]Credential, error) {
	repo := stripTagDigest(image)
	if !p.Matches(repo) {
		return nil, nil
	}
	host, _, _ := strings.Cut(repo, "/")
	p.mu.Lock()
	for _, key := range []string{"image:" + repo, "registry:" + host, "global:"} {
		if e, ok := p.cache[key]; ok {
			if p.now().Before(e.expires) {
				p.mu.Unlock()
				return e.keyring.Lookup(repo), nil
			}
			delete(p.cache, key)
		}
	}
	p.mu.Unlock()

	resp, err := p.exec(ctx, repo)
	if err != nil {
		return nil, err
	}
	k := &Keyring{}
	for key, a := range resp.Auth {
		k.Add(key, Credential{Username: a.Username, Password: a.Password, Source: "credential provider " + p.Spec.Name})
	}
	dur := p.DefaultCacheDuration
	if resp.CacheDuration != "" {
		if d, err := time.ParseDuration(resp.CacheDuration); err == nil {
			dur = d
		}
	}
	if dur > 0 {
		var key string
		switch resp.CacheKeyType {
		case "Image":
			key = "image:" + repo
		case "Registry":
			key = "registry:" + host
		case "Global":
			key = "global:"
		}
		if key != "" {
			p.mu.Lock()
			p.cache[key] = cacheEntry{keyring: k, expires: p.now().Add(dur)}
			p.mu.Unlock()
		}
	}
	return k.Lookup(repo), nil
}

func (p *Plugin) exec(ctx context.Context, repo string) (*providerResponse, error) {
	req, err := json.Marshal(providerRequest{APIVersion: p.Spec.APIVersion, Kind: "CredentialProviderRequest", Image: repo})
	if err != nil {
		return nil, err
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultPluginTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.Bin, p.Spec.Args...)
	// A plugin may leave a child behind (a helper, a CLI it spawned) that
	// holds its stdout. Killing only the plugin would leave Run waiting for
	// that child to close the pipe, unbounded by any timeout. So the plugin
	// gets a process group of its own, the whole group is killed when the
	// timeout ends, and the pipes are closed pluginWaitDelay after the
	// plugin exited or was killed, whoever still holds them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = pluginWaitDelay
	cmd.Env = os.Environ()
	for _, e := range p.Spec.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Stdin = bytes.NewReader(req)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		// The plugin exited 0 but something it started kept stdout open:
		// its answer is complete; the stragglers are not needed.
		_ = killGroup(cmd)
		err = nil
	}
	if err != nil {
		_ = killGroup(cmd)
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return nil, fmt.Errorf("credential provider %s: %w: %s", p.Spec.Name, err, msg)
	}
	var resp providerResponse
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("credential provider %s: response is not valid JSON", p.Spec.Name)
	}
	if resp.Kind != "CredentialProviderResponse" || resp.APIVersion != p.Spec.APIVersion {
		return nil, fmt.Errorf("credential provider %s: response is %s %s, want %s CredentialProviderResponse", p.Spec.Name, resp.APIVersion, resp.Kind, p.Spec.APIVersion)
	}
	return &resp, nil
}
