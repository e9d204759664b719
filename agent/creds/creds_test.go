package creds

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestURLsMatch(t *testing.T) {
	cases := []struct {
		pattern, image string
		want           bool
	}{
		{"registry.example.com", "registry.example.com/team/app", true},
		{"registry.example.com", "other.example.com/team/app", false},
		{"*.example.com", "registry.example.com/app", true},
		{"*.example.com", "example.com/app", false},
		{"*.example.com", "a.b.example.com/app", false},
		{"*.*.example.com", "a.b.example.com/app", true},
		{"registry.*.com", "registry.example.com/app", true},
		{"*.dkr.ecr.*.amazonaws.com", "123.dkr.ecr.us-east-1.amazonaws.com/app", true},
		{"registry.example.com/team", "registry.example.com/team/app", true},
		{"registry.example.com/team", "registry.example.com/other/app", false},
		{"registry.example.com:5000", "registry.example.com:5000/app", true},
		{"registry.example.com:5000", "registry.example.com/app", false},
		{"registry.example.com", "registry.example.com:5000/app", false},
		{"registry.example.com/team/app", "registry.example.com/team", false},
	}
	for _, c := range cases {
		if got := URLsMatch(c.pattern, c.image); got != c.want {
			t.Errorf("URLsMatch(%q, %q) = %v, want %v", c.pattern, c.image, got, c.want)
		}
	}
}

func users(cs []Credential) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Username)
	}
	return strings.Join(out, ",")
}

func TestKeyringLookup(t *testing.T) {
	var k Keyring
	for key, user := range map[string]string{
		"https://index.docker.io/v1/":            "hub",
		"registry.example.com":                   "host",
		"http://registry.example.com/team":       "team",
		"https://registry.example.com/v2/team/a": "teamapp",
		"*.corp.example":                         "wild",
		"reg.corp.example:5000":                  "port",
	} {
		k.Add(key, Credential{Username: user, Password: "p"})
	}
	cases := []struct{ image, want string }{
		{"docker.io/library/debian:latest", "hub"},
		{"docker.io/someone/app:1", "hub"},
		{"registry.example.com/team/a/b:1", "teamapp,team,host"},
		{"registry.example.com/team/x:1", "team,host"},
		{"registry.example.com/other@sha256:" + strings.Repeat("0", 64), "host"},
		{"a.corp.example/x:1", "wild"},
		{"reg.corp.example:5000/x:1", "port"},
		{"reg.corp.example/x:1", "wild"},
		{"quay.io/x/y:1", ""},
	}
	for _, c := range cases {
		if got := users(k.Lookup(c.image)); got != c.want {
			t.Errorf("Lookup(%q) = %q, want %q", c.image, got, c.want)
		}
	}
}

func TestParseDockerConfigFormats(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("u1:p:with:colons"))
	cases := map[string]string{
		"dockerconfigjson": `{"auths":{"r.example.com":{"auth":"` + auth + `"}}}`,
		"dockercfg":        `{"r.example.com":{"auth":"` + auth + `","email":"x@y"}}`,
		"config.json":      `{"auths":{"r.example.com":{"auth":"` + auth + `"}},"credHelpers":{"gcr.io":"gcloud"}}`,
	}
	for name, data := range cases {
		got, err := ParseDockerConfig([]byte(data))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		c := got["r.example.com"]
		if c.Username != "u1" || c.Password != "p:with:colons" {
			t.Errorf("%s: %+v", name, got)
		}
	}
	userpass, err := ParseDockerConfig([]byte(`{"auths":{"r":{"username":"u","password":"p"}}}`))
	if err != nil || userpass["r"].Username != "u" || userpass["r"].Password != "p" {
		t.Errorf("username/password fields: %v %v", userpass, err)
	}
	if _, err := ParseDockerConfig([]byte(`{"auths":{"r":{"auth":"!!!"}}}`)); err == nil {
		t.Error("bad base64 accepted")
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	c := Credential{Username: "u", Password: "hunter2", IdentityToken: "tok3n", Source: "x"}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), c.LogValue().String()} {
		if strings.Contains(s, "hunter2") || strings.Contains(s, "tok3n") {
			t.Errorf("secret printed: %s", s)
		}
	}
	// A bad file's error must not quote its content.
	dir := t.TempDir()
	p := filepath.Join(dir, ".dockerconfigjson")
	if err := os.WriteFile(p, []byte(`{"auths":{"r":{"auth":"hunter2!"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var k Keyring
	err := LoadDockerConfig(&k, dir)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v", err)
	}
}

func TestLoadDockerConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, DockerConfigJSONKey), []byte(`{"auths":{"a.example.com":{"username":"a","password":"x"}}}`), 0o600))
	must(os.WriteFile(filepath.Join(dir, DockerConfigKey), []byte(`{"b.example.com":{"username":"b","password":"x"}}`), 0o600))
	var k Keyring
	must(LoadDockerConfig(&k, dir))
	if users(k.Lookup("a.example.com/x:1")) != "a" || users(k.Lookup("b.example.com/x:1")) != "b" {
		t.Error("both files of a pull-secret directory must be read")
	}
	if err := LoadDockerConfig(&k, t.TempDir()); err == nil {
		t.Error("empty directory accepted")
	}
}

// writePlugin writes a shell credential plugin that records its request,
// arguments and environment, and answers with the given response.
func writePlugin(t *testing.T, dir, name, response string) string {
	t.Helper()
	log := filepath.Join(dir, name+".log")
	script := fmt.Sprintf("#!/bin/sh\necho \"args=$* env=$PLUGIN_ENV\" >> %s\ncat >> %s\necho >> %s\ncat <<'EOF'\n%s\nEOF\n", log, log, log, response)
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return log
}

func TestExecPlugin(t *testing.T) {
	bin := t.TempDir()
	log := writePlugin(t, bin, "ecr-login", `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"1h","auth":{"*.dkr.ecr.*.amazonaws.com":{"username":"AWS","password":"pw"}}}`)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-login
    matchImages: ["*.dkr.ecr.*.amazonaws.com"]
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials, --verbose]
    env:
      - name: PLUGIN_ENV
        value: from-config
`), 0o600); err != nil {
		t.Fatal(err)
	}
	plugins, err := LoadProviderConfig(cfg, bin)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	plugins[0].Now = func() time.Time { return now }
	p := &Provider{Plugins: plugins}
	ctx := context.Background()
	img := "123.dkr.ecr.us-east-1.amazonaws.com/team/app:1"
	got := p.Lookup(ctx, img)
	if len(got) != 1 || got[0].Username != "AWS" || got[0].Password != "pw" || got[0].ServerAddress != "https://123.dkr.ecr.us-east-1.amazonaws.com" {
		t.Fatalf("auth %v", got)
	}
	// Same registry within the cache duration: no second exec.
	p.Lookup(ctx, "123.dkr.ecr.us-east-1.amazonaws.com/other:2")
	// Not matched by matchImages: never executed.
	if got := p.Lookup(ctx, "quay.io/x/y:1"); len(got) != 0 {
		t.Errorf("unmatched image got %v", got)
	}
	now = now.Add(2 * time.Hour)
	p.Lookup(ctx, img)
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 4 {
		t.Fatalf("plugin ran %d times, want 2:\n%s", len(lines)/2, data)
	}
	if lines[0] != "args=get-credentials --verbose env=from-config" {
		t.Errorf("args/env line %q", lines[0])
	}
	if lines[1] != `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"123.dkr.ecr.us-east-1.amazonaws.com/team/app"}` {
		t.Errorf("request %q", lines[1])
	}
}

func TestExecPluginFailureFallsBack(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "broken"), []byte("#!/bin/sh\necho boom >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pl := &Plugin{Spec: ProviderSpec{Name: "broken", MatchImages: []string{"r.example.com"}, APIVersion: ProviderAPIVersion}, Bin: filepath.Join(bin, "broken"), cache: map[string]cacheEntry{}}
	p := &Provider{Plugins: []*Plugin{pl}}
	p.Keyring.Add("r.example.com", Credential{Username: "static", Password: "x"})
	got := p.Lookup(context.Background(), "r.example.com/a:1")
	if len(got) != 1 || got[0].Username != "static" {
		t.Errorf("got %v", got)
	}
	if _, err := pl.Lookup(context.Background(), "r.example.com/a:1"); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("err %v", err)
	}
}

func TestLoadProviderConfigErrors(t *testing.T) {
	for name, body := range map[string]string{
		"kind":     "apiVersion: kubelet.config.k8s.io/v1\nkind: Other\n",
		"match":    "kind: CredentialProviderConfig\nproviders: [{name: a}]\n",
		"name":     "kind: CredentialProviderConfig\nproviders: [{name: ../a, matchImages: [x]}]\n",
		"duration": "kind: CredentialProviderConfig\nproviders: [{name: a, matchImages: [x], defaultCacheDuration: soon}]\n",
	} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadProviderConfig(p, "/bin"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseDockerConfig(f *testing.F) {
	f.Add([]byte(`{"auths":{"r.example.com":{"auth":"dTpw"}}}`))
	f.Add([]byte(`{"r":{"username":"u","password":"p"}}`))
	f.Add([]byte(`{"auths":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseDockerConfig(data)
		if err != nil {
			return
		}
		var k Keyring
		for key, c := range got {
			k.Add(key, c)
			k.Lookup(key + "/x:1")
		}
	})
}

func TestServerAddressHasSchemeAndTheHostContainerdContacts(t *testing.T) {
	p := &Provider{}
	p.Keyring.Add("https://index.docker.io/v1/", Credential{Username: "hub", Password: "x"})
	p.Keyring.Add("r.example.com:5000", Credential{Username: "r", Password: "x"})
	for image, want := range map[string]string{
		"docker.io/library/debian:latest": "https://registry-1.docker.io",
		"r.example.com:5000/a/b:1":        "https://r.example.com:5000",
	} {
		got := p.Lookup(context.Background(), image)
		if len(got) != 1 || got[0].ServerAddress != want {
			t.Errorf("%s: %v, want server %s", image, got, want)
		}
	}
}
