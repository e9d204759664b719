package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildHungPlugin builds testdata/hungplugin statically (the agent image
// has no libc) into a host directory the pods can mount: /var/tmp is the
// host's own in the nodes' mount namespaces (docs/testing.md).
func buildHungPlugin(t *testing.T) (configPath, binDir string) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "ipf-e2e-plugin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	binDir = filepath.Join(dir, "bin")
	if err := os.Mkdir(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(binDir, "hung-plugin"), "./tests/e2e/testdata/hungplugin")
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the plugin: %v\n%s", err, out)
	}
	configPath = filepath.Join(dir, "config.yaml")
	config := `apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: hung-plugin
  matchImages: ["ghcr.io"]
  defaultCacheDuration: 1m
  apiVersion: credentialprovider.kubelet.k8s.io/v1
`
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return configPath, binDir
}

// pluginHelpers lists the processes of the plugin's helper still running
// on this machine (every node's pods run here).
func pluginHelpers(binDir string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 2 && args[0] == filepath.Join(binDir, "hung-plugin") && args[1] == "hold" {
			found = append(found, filepath.Dir(p))
		}
	}
	return found
}

// A credential plugin exits at once but leaves a helper holding its stdout.
// The real agent, in the DaemonSet the function renders, against real
// containerd, must not hang on it: it gives the plugin up, pulls the public
// images anonymously, and labels the node within the plugin timeout (1 min)
// plus the pull time. The helper is killed with the plugin's process group.
func TestHungCredentialPlugin(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 1900, 64<<10, "plugin-a", "plugin-b")
	configPath, binDir := buildHungPlugin(t)
	spec := yamlList(refs) + fmt.Sprintf("  credentialProvider:\n    configPath: %s\n    binDir: %s\n", configPath, binDir)
	start := time.Now()
	d := e.deployInstance(t, instance{Name: "plugin", Namespace: "e2e-plugin", Spec: spec})
	for _, n := range c.Nodes() {
		// 1 min of plugin timeout, pulls of two 64 KiB images, and the
		// pod's start.
		st := e.waitLabel(t, d, n.Name, "succeeded", 90*time.Second)
		if st.summary.Present != 2 {
			t.Errorf("%s: summary %s", n.Name, st.annotation)
		}
	}
	logf(t, "both nodes labeled %.1fs after the apply", time.Since(start).Seconds())
	pod := e.podOn(t, d, c.Nodes()[0].Name)
	e.logLine(t, d.Namespace, pod, "fetch", start, "credential provider failed", "hung-plugin")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := poll(ctx, "no plugin helper left running", func() (bool, string) {
		left := pluginHelpers(binDir)
		return len(left) == 0, fmt.Sprint(left)
	}); err != nil {
		t.Error(err)
	}
}
