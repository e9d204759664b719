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

// probeSource checks, from inside a pod, that the API server answers at
// the kubernetes Service address with the pod's own service-account token
// and CA: the path every in-cluster client takes. It exits 0 on HTTP 200.
const probeSource = `package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
)

func main() {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	token, err := os.ReadFile(sa + "token")
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	ca, err := os.ReadFile(sa + "ca.crt")
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")) + "/version"
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+string(token))
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(url, resp.Status, string(body))
	if resp.StatusCode != http.StatusOK {
		os.Exit(1)
	}
}
`

// PauseBinary builds (once, cached by source hash) a static binary that
// blocks until SIGTERM, and returns its path.
func PauseBinary(ctx context.Context) (string, error) {
	return buildEmbedded(ctx, "pause", pauseSource)
}

// ProbeBinary builds (once, cached) a static binary that calls the API
// server from inside a pod the way in-cluster clients do, and exits 0 if
// it answers.
func ProbeBinary(ctx context.Context) (string, error) {
	return buildEmbedded(ctx, "api-probe", probeSource)
}

func buildEmbedded(ctx context.Context, name, source string) (string, error) {
	sum := sha256.Sum256([]byte(source))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "image-prefetcher", name+"-"+hex.EncodeToString(sum[:8]))
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	src, err := os.MkdirTemp("", name+"-src")
	if err != nil {
		return "", fmt.Errorf("%s source dir: %w", name, err)
	}
	defer os.RemoveAll(src)
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(source), 0o644); err != nil {
		return "", fmt.Errorf("write %s source: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module "+name+"\n\ngo 1.22\n"), 0o644); err != nil {
		return "", fmt.Errorf("write %s go.mod: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, name+".tmp")
	if err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp.Name(), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOTOOLCHAIN=local", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s binary (needs the go toolchain): %w: %s", name, err, out)
	}
	// Rename is atomic, so concurrent runs never see half a binary.
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("install %s binary: %w", name, err)
	}
	return bin, nil
}
