package version

import (
	"os"
	"strings"
	"testing"
)

func TestVersionMatchesVersionFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(b)); Version != want {
		t.Fatalf("version.Version = %q, VERSION file says %q: update fn/version/version.go", Version, want)
	}
}

// A release build stamps the registry and the agent digest; the default
// image then names both, tag and digest.
func TestAgentImage(t *testing.T) {
	tests := []struct {
		repo, digest, want string
	}{
		{AgentImageRepository, "", AgentImageRepository + ":" + Version},
		{"registry.example.com/prefetch/image-prefetcher", "sha256:0123",
			"registry.example.com/prefetch/image-prefetcher:" + Version + "@sha256:0123"},
	}
	for _, tt := range tests {
		repo, digest := AgentImageRepository, AgentImageDigest
		AgentImageRepository, AgentImageDigest = tt.repo, tt.digest
		got := AgentImage()
		AgentImageRepository, AgentImageDigest = repo, digest
		if got != tt.want {
			t.Errorf("AgentImage() with %q, %q = %q, want %q", tt.repo, tt.digest, got, tt.want)
		}
	}
}
