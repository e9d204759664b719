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
