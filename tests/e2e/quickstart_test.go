package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
)

// Scenario 14: examples/quickstart, unchanged, deployed by the code path
// of `make demo` (tests/cluster/demo.Deploy): rendered from its own
// directory with ./bin/kustomize and ./bin/image-prefetcher-fn on PATH,
// stand-ins pushed for its docker.io images, applied with the cluster's
// kubectl. Both nodes end succeeded with every listed image present in
// their containerd. Because the demo calls the same function, a change
// that breaks `make demo` fails here too.
func Test14Quickstart(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), labelWait+2*time.Minute)
	defer cancel()
	var kubectl bytes.Buffer
	dep, err := demo.Deploy(ctx, c, demo.Options{
		BinDir:  filepath.Join(repoRoot(), "bin"),
		Example: filepath.Join(repoRoot(), "examples", "quickstart"),
		// setup pushed the agent under the reference the function renders
		// by default, as `make demo` does, so the example needs no edit.
		AgentRef: e.agentRef,
		Timeout:  labelWait,
		Out:      &kubectl,
		Progress: func(format string, args ...any) { logf(t, format, args...) },
	})
	if dep.Instance != "" {
		// Registered in this order so that the instance (and its pods) is
		// removed before the stand-ins are removed from the nodes.
		forgetImages(t, dep.StandIns...)
		d := &deployed{instance: instance{Name: dep.Instance, Namespace: dep.Namespace}, objs: dep.Objects}
		t.Cleanup(func() { e.remove(t, d) })
	}
	logf(t, "kubectl apply:\n%s", strings.TrimSpace(kubectl.String()))
	if err != nil {
		e.dumpPods(t, dep.Namespace)
		t.Fatalf("the demo's deployment of examples/quickstart: %v", err)
	}
	if dep.Instance != "quickstart" || dep.Namespace != "image-prefetcher" {
		t.Errorf("rendered instance %s in namespace %s, want quickstart in image-prefetcher", dep.Instance, dep.Namespace)
	}
	if want := []string{"docker.io/library/busybox:1.37", "docker.io/library/nginx:1.27"}; fmt.Sprint(dep.StandIns) != fmt.Sprint(want) {
		t.Errorf("stand-ins pushed for %v, want %v", dep.StandIns, want)
	}
	// The rendered DaemonSet runs the function's default agent image, the
	// one setup pushed: the example pins nothing the cluster cannot serve.
	for _, o := range dep.Objects {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			for _, ct := range cs {
				if img, _, _ := unstructured.NestedString(ct.(map[string]any), "image"); img != e.agentRef {
					t.Errorf("the rendered DaemonSet's %s run %s, want the default agent image %s", field, img, e.agentRef)
				}
			}
		}
	}

	// Deploy returns once every node has the label, whatever its value.
	for _, n := range c.Nodes() {
		st, err := e.state(ctx, n.Name, dep.Key)
		if err != nil {
			t.Fatal(err)
		}
		s := st.summary
		if st.label != "succeeded" || s.Total != len(dep.Images) || s.Present != len(dep.Images) || len(s.Failed) != 0 {
			t.Errorf("%s: label %q annotation %s, want succeeded with %d/%d present", n.Name, st.label, st.annotation, len(dep.Images), len(dep.Images))
		}
	}
	assertImages(t, c.Nodes(), dep.Images, true)

	// The demo ends with `image-prefetcher status`, which must exit 0.
	out, code := runStatus(t, ctx, "--instance", dep.Instance)
	if code != 0 {
		t.Errorf("status exited %d, want 0; output:\n%s", code, out)
	}
	rows := statusRows(out)
	for _, n := range c.Nodes() {
		total := fmt.Sprintf("%d/%d", len(dep.Images), len(dep.Images))
		// PINNED: the nodes run Debian's containerd 1.6.20. IMAGE-FS: their
		// kubelets serve self-signed certificates, as kubeadm's do by
		// default, so the agent sends them no token; its own root
		// filesystem gives the figures (issue 48), "NN% (ceiling 80%)".
		w := []string{n.Name, dep.Instance, "succeeded", dep.Namespace + "/" + dep.Instance, total, "pinning", "unsupported", "%", "(ceiling", "80%)", "-"}
		if fmt.Sprint(maskImageFs(rows[n.Name])) != fmt.Sprint(w) {
			t.Errorf("status row for %s = %q, want %q (IMAGE-FS: NN%% (ceiling 80%%)); output:\n%s", n.Name, rows[n.Name], w, out)
		}
	}
}
