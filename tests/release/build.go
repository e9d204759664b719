package release

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const module = "github.com/image-prefetcher/image-prefetcher"

// Platform is one GOOS/GOARCH pair.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// ImagePlatforms are the platforms of both image indexes.
var ImagePlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}

// FunctionPlatforms are the platforms the function binary is released for:
// CI runners and laptops run kustomize and kpt.
var FunctionPlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}

// goBuild cross-compiles pkg for p into out with the flags of the Makefile's
// release builds (static, -trimpath, grpcnotrace) and the -X stamps given.
func goBuild(ctx context.Context, srcDir, pkg, out string, p Platform, stamps map[string]string) error {
	ldflags := []string{"-s", "-w"}
	for _, k := range sortedKeys(stamps) {
		ldflags = append(ldflags, "-X", module+"/"+k+"="+stamps[k])
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(out), err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags=grpcnotrace",
		"-ldflags", strings.Join(ldflags, " "), "-o", out, pkg)
	cmd.Dir = srcDir
	// GOFLAGS is cleared so that the flags above are the whole set, whatever
	// the caller's environment (the Makefile exports the same ones).
	cmd.Env = append(os.Environ(), "GOOS="+p.OS, "GOARCH="+p.Arch, "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s for %s: %w\n%s", pkg, p, err, b)
	}
	return nil
}
