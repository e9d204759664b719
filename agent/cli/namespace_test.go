package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// The reference tool's manifests set NODE_NAME and INSTANCE_NAME but no
// POD_NAMESPACE; the namespace comes from the pod's service-account
// directory, as client-go's in-cluster config reads it (issue 26,
// finding 8).
func TestNamespaceFromServiceAccount(t *testing.T) {
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "namespace")
	if err := os.WriteFile(file, []byte("legacy"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.namespaceFile = file
	e.getenv["NODE_NAME"], e.getenv["INSTANCE_NAME"] = testNode, testInstance
	if code := e.run("fetch", "--cri-socket="+e.cri.Socket, "app:1"); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	v, s, ok := e.state()
	if !ok || v != "succeeded" || s.Owner == nil || *s.Owner != label.NewOwner("legacy", testInstance) {
		t.Errorf("label %q owner %+v, want succeeded owned by legacy/demo\n%s", v, s.Owner, e.logs)
	}
}

// The function renders the namespace it rendered for into the pod
// (INSTANCE_NAMESPACE). A namespace: applied above the function moves the
// pod elsewhere, away from its admission policy and its mark: the agent
// says so and refuses to run rather than label under another identity.
func TestInstanceMovedToAnotherNamespace(t *testing.T) {
	for _, sub := range []string{"fetch", "watch"} {
		t.Run(sub, func(t *testing.T) {
			e := newEnv(t)
			e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"], e.getenv["INSTANCE_NAMESPACE"] = "image-prefetcher-demo-x7k2p", "moved", "prefetch"
			args := []string{sub, "--cri-socket=" + e.cri.Socket, "--node-name=" + testNode, "--instance=" + testInstance, "app:1"}
			if code := e.run(args...); code != ExitInstanceMoved {
				t.Errorf("exit %d, want %d:\n%s", code, ExitInstanceMoved, e.logs)
			}
			if _, _, ok := e.state(); ok {
				t.Error("labeled the node")
			}
			if !strings.Contains(e.logs.String(), `rendered for namespace prefetch`) || !strings.Contains(e.logs.String(), "runs in namespace moved") {
				t.Errorf("no error line naming both namespaces:\n%s", e.logs)
			}
			if evs := e.eventsIn("moved", "InstanceMoved"); len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning {
				t.Errorf("events %+v, want one Warning InstanceMoved", evs)
			}
		})
	}
}

func TestStartupTaintReservedKeyFlag(t *testing.T) {
	e := newEnv(t)
	if code := e.run(e.agentArgs("fetch", "--startup-taint=node.kubernetes.io/not-ready", "app:1")...); code != ExitUsage {
		t.Errorf("exit %d, want %d:\n%s", code, ExitUsage, e.logs)
	}
	if !strings.Contains(e.logs.String(), "node.kubernetes.io/not-ready") {
		t.Errorf("the error does not name the key:\n%s", e.logs)
	}
}
