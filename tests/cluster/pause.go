package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// pauseSource is the sandbox's init process: it blocks until SIGTERM or
// SIGINT and reaps orphans meanwhile. It is also a convenient long-running
// container for tests (PauseBinary).
const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
`

// PauseBinary builds (once, cached by source hash) a static binary that
// blocks until SIGTERM, and returns its path.
func PauseBinary(ctx context.Context) (string, error) {
	sum := sha256.Sum256([]byte(pauseSource))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "image-prefetcher", "pause-"+hex.EncodeToString(sum[:8]))
	bin := filepath.Join(dir, "pause")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	src, err := os.MkdirTemp("", "pause-src")
	if err != nil {
		return "", fmt.Errorf("pause source dir: %w", err)
	}
	defer os.RemoveAll(src)
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(pauseSource), 0o644); err != nil {
		return "", fmt.Errorf("write pause source: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module pause\n\ngo 1.22\n"), 0o644); err != nil {
		return "", fmt.Errorf("write pause go.mod: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOTOOLCHAIN=local", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build pause binary (needs the go toolchain): %w: %s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("install pause binary: %w", err)
	}
	return bin, nil
}
