package release

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// Credentials come from REGISTRY_USERNAME/REGISTRY_PASSWORD for the release
// registry's host, else from the docker config; other hosts get nothing
// from the environment.
func TestKeychain(t *testing.T) {
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("fromconfig:pw1"))
	config := `{"auths":{"reg.example.com":{"auth":"` + auth + `"},"other.example.com":{"auth":"` + auth + `"}}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
	tests := []struct {
		name, envUser, host, wantUser string
	}{
		{"docker config", "", "reg.example.com", "fromconfig"},
		{"environment first", "fromenv", "reg.example.com", "fromenv"},
		{"environment only for the release registry", "fromenv", "other.example.com", "fromconfig"},
		{"nothing", "", "none.example.com", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("REGISTRY_USERNAME", tt.envUser)
			t.Setenv("REGISTRY_PASSWORD", "pw2")
			reg, err := name.NewRegistry(tt.host)
			if err != nil {
				t.Fatal(err)
			}
			a, err := Keychain("reg.example.com").Resolve(reg)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := authn.Authorization(t.Context(), a)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Username != tt.wantUser {
				t.Errorf("user %q, want %q", cfg.Username, tt.wantUser)
			}
		})
	}
}
