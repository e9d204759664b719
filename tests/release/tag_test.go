package release

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// CI releases only a clean tree whose HEAD carries v<VERSION>.
func TestCheckTag(t *testing.T) {
	tests := []struct {
		name  string
		tag   string
		dirty bool
		ok    bool
	}{
		{"tagged", "v1.2.3", false, true},
		{"untagged", "", false, false},
		{"another tag", "v1.2.4", false, false},
		{"tagged but changed", "v1.2.3", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			git := func(args ...string) {
				t.Helper()
				cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("git %v: %v\n%s", args, err, out)
				}
			}
			write := func(content string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			git("init", "-q")
			write("1.2.3\n")
			git("add", "VERSION")
			git("commit", "-qm", "release")
			if tt.tag != "" {
				git("tag", tt.tag)
			}
			if tt.dirty {
				write("1.2.4\n")
			}
			if err := CheckTag(context.Background(), dir, "1.2.3"); (err == nil) != tt.ok {
				t.Errorf("CheckTag = %v, want ok %v", err, tt.ok)
			}
		})
	}
}
