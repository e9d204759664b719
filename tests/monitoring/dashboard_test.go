package monitoring_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// TestDashboardConfigMap builds kustomize/monitoring with the real
// kustomize, as docs/monitoring.md says, and checks that it is the
// dashboard, whole, in a ConfigMap Grafana's sidecar picks up.
func TestDashboardConfigMap(t *testing.T) {
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(bin)
	kustomize := filepath.Join(bin, "kustomize")
	if _, err := os.Stat(kustomize); err != nil {
		t.Fatalf("%s is missing: run `make tools`", kustomize)
	}
	out, err := exec.Command(kustomize, "build", filepath.Join(root, "kustomize", "monitoring")).Output()
	if err != nil {
		t.Fatalf("kustomize build kustomize/monitoring: %v", err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(out, &cm); err != nil {
		t.Fatalf("not one ConfigMap: %v\n%s", err, out)
	}
	want, err := os.ReadFile(filepath.Join(root, dashboard))
	if err != nil {
		t.Fatal(err)
	}
	if cm.Kind != "ConfigMap" || cm.Name != "image-prefetcher-dashboard" || cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("got %s %s labels %v, want ConfigMap image-prefetcher-dashboard labelled grafana_dashboard=1", cm.Kind, cm.Name, cm.Labels)
	}
	if cm.Data["grafana-dashboard.json"] != string(want) {
		t.Errorf("the ConfigMap does not hold %s as it is", dashboard)
	}
}
