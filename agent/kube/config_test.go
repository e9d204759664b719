package kube

import (
	"os"
	"path/filepath"
	"testing"
)

// TestConfigFallsBackToKUBECONFIG: outside a pod, an empty --kubeconfig
// takes client-go's default rules, $KUBECONFIG first (docs/agent.md).
func TestConfigFallsBackToKUBECONFIG(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	file := filepath.Join(t.TempDir(), "config")
	const server = "https://127.0.0.1:16443"
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + server + "\n" +
		"contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n"
	if err := os.WriteFile(file, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", file)
	cfg, err := Config("")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != server {
		t.Errorf("host %q, want %q from $KUBECONFIG", cfg.Host, server)
	}
}
