package creds

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// writeSecretVolume lays out a Secret volume the way the kubelet's atomic
// writer does: the data in a timestamped directory, a ..data symlink to
// it, and each key a symlink through ..data. A second call swaps ..data
// to a new directory with a rename, as an update of the Secret does.
func writeSecretVolume(t *testing.T, dir, version, dockerconfigjson string) {
	t.Helper()
	ts := "..2026_11_24_" + version
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ts, DockerConfigJSONKey), []byte(dockerconfigjson), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, DockerConfigJSONKey)
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", DockerConfigJSONKey), link); err != nil {
			t.Fatal(err)
		}
	}
}

// A rotated pull secret (a refreshed registry token written into the
// Secret) is used at the next lookup, without restarting the agent.
func TestPullSecretRotationIsPickedUp(t *testing.T) {
	dir := t.TempDir()
	writeSecretVolume(t, dir, "a", `{"auths":{"r.example.com":{"username":"u","password":"old"}}}`)
	p := &Provider{Secrets: &DockerConfigs{Paths: []string{dir}, Log: discardLog()}}
	password := func() string {
		t.Helper()
		got := p.Lookup(context.Background(), "r.example.com/team/app:1")
		if len(got) != 1 {
			t.Fatalf("%d credentials, want 1", len(got))
		}
		return got[0].Password
	}
	if pw := password(); pw != "old" {
		t.Fatalf("password %q, want old", pw)
	}
	writeSecretVolume(t, dir, "b", `{"auths":{"r.example.com":{"username":"u","password":"new"}}}`)
	if pw := password(); pw != "new" {
		t.Errorf("after the rotation: password %q, want new", pw)
	}
	// A Secret that became unusable leaves no stale credential behind.
	writeSecretVolume(t, dir, "c", `not json`)
	if got := p.Lookup(context.Background(), "r.example.com/team/app:1"); len(got) != 0 {
		t.Errorf("after the Secret broke: %v, want no credential", got)
	}
}

// Unchanged files are not parsed again.
func TestPullSecretsAreReadOnlyWhenChanged(t *testing.T) {
	dir := t.TempDir()
	writeSecretVolume(t, dir, "a", `{"auths":{"r.example.com":{"username":"u","password":"p"}}}`)
	d := &DockerConfigs{Paths: []string{dir}, Log: discardLog()}
	d.Lookup("r.example.com/a:1")
	first := d.stamp
	d.keyring.Add("marker.example.com", Credential{Username: "kept"})
	d.Lookup("r.example.com/a:1")
	if d.stamp != first || len(d.keyring.Lookup("marker.example.com/a:1")) != 1 {
		t.Error("the keyring was rebuilt although no file changed")
	}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }
