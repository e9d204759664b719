// Package quickstart_test deploys examples/quickstart as `make demo` does
// (tests/cluster/demo.Deploy: the standalone kustomize and ./bin's
// function, the default rendering) on a cluster of a containerd 2.4.2 node
// and a CRI-O 1.34.0 node whose kubelets serve self-signed certificates,
// as kubeadm's, kind's and the demo's do (issue 48). Each node's image
// store is a 192 MiB tmpfs of its own, so that the default ceiling of 80%
// is within a test's reach; the kubelets keep the harness's thresholds
// (no image GC, eviction below 1%), which the test stays clear of.
//
// The quickstart renders for containerd's socket: it runs on the
// containerd node as rendered, placed there by a kustomize overlay. The
// CRI-O node runs the same ImagePrefetcher with `runtime: crio`, the line
// a CRI-O user adds, under a name of its own.
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/quickstart/ (after
// `make build tools host-deps kube runtimes oci`).
package quickstart_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// runtimeLabel names each node's runtime, as node pools are labeled.
const runtimeLabel = "e2e.image-prefetcher.io/runtime"

// storeBytes is each node's image filesystem.
const storeBytes = 192 << 20

// runtimes are the nodes' runtimes, node-1 first.
var runtimes = []cluster.Runtime{cluster.Containerd2, cluster.CRIO}

var c *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, cluster.Options{
		Deploys:         true,
		Nodes:           len(runtimes),
		NodeRuntime:     func(i int) cluster.Runtime { return runtimes[i] },
		NodeLabels:      func(i int) map[string]string { return map[string]string{runtimeLabel: string(runtimes[i])} },
		ImageStoreBytes: storeBytes,
	}, &c))
}

// quickstartDir is examples/quickstart in this checkout.
func quickstartDir(t *testing.T) string {
	t.Helper()
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(bin), "examples", "quickstart")
}

// containerdOverlay is a kustomization that renders examples/quickstart
// unchanged and adds the containerd node's label to its DaemonSet's
// nodeSelector: rendered for containerd's socket, the agent would find no
// runtime on the CRI-O node.
func containerdOverlay(t *testing.T, quickstart string) string {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, quickstart)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
patches:
- target:
    kind: DaemonSet
  patch: |-
    - op: add
      path: /spec/template/spec/nodeSelector/%s
      value: %s
`, base, strings.ReplaceAll(runtimeLabel, "/", "~1"), cluster.Containerd2)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// crioCopy is a copy of examples/quickstart whose ImagePrefetcher is set
// for the CRI-O node: `runtime: crio` (CRI-O's socket), the name
// quickstart-crio beside the containerd node's quickstart, and the CRI-O
// node's label as its nodeSelector. The list and every default (the pin
// budget, the disk ceiling, the kubelet stats) stay as they are.
func crioCopy(t *testing.T, quickstart string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"kustomization.yaml", "namespace.yaml"} {
		b, err := os.ReadFile(filepath.Join(quickstart, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(quickstart, "imageprefetcher.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ip struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       map[string]any `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(raw, &ip); err != nil {
		t.Fatalf("examples/quickstart/imageprefetcher.yaml: %v", err)
	}
	ip.Metadata["name"] = "quickstart-crio"
	ip.Spec["runtime"] = "crio"
	ip.Spec["nodeSelector"] = map[string]string{runtimeLabel: string(cluster.CRIO)}
	out, err := yaml.Marshal(ip)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "imageprefetcher.yaml"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
