package pins_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
)

// uninstallBound is how long after the deletion no mark of the instance
// may be left (issue 51).
const uninstallBound = 60 * time.Second

// Deleting everything examples/quickstart renders at once, as `kubectl
// delete -f` and `kubectl delete -k` do, or the namespace first with
// background propagation and then the rest, as an Argo CD or Flux prune may,
// then running `image-prefetcher status --cleanup` as docs/install.md says,
// leaves within 60 s no label, annotation, taint or pin of the instance,
// and no object (issue 51). The agents remove their pins on SIGTERM, but
// not their key: their ServiceAccount and RBAC are gone by then.
func TestUninstallEverythingAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delete func(ctx context.Context, t *testing.T, cs kubernetes.Interface, dep *demo.Deployment)
	}{
		{name: "kubectl delete -f", delete: kubectlDelete},
		{name: "namespace first, background propagation", delete: func(ctx context.Context, t *testing.T, cs kubernetes.Interface, dep *demo.Deployment) {
			bg := metav1.DeletePropagationBackground
			if err := cs.CoreV1().Namespaces().Delete(ctx, dep.Namespace, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
				t.Fatal(err)
			}
			kubectlDelete(ctx, t, cs, dep)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := node(t)
			dep := deployQuickstart(t)
			// The list's images go with the test: the GC tests that follow
			// count what the kubelet removes (a fresh-clone run saw it remove
			// these, unpinned by the uninstall).
			t.Cleanup(func() {
				for _, ref := range dep.Images {
					if err := rt.n.Remove(context.Background(), ref); err != nil {
						t.Error(err)
					}
				}
			})
			cs, err := c.Clientset()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*uninstallBound)
			defer cancel()
			start := time.Now()
			tc.delete(ctx, t, cs, dep)
			cleanup(ctx, t, dep)
			left := func() (bool, string) {
				var found []string
				n, err := cs.CoreV1().Nodes().Get(ctx, c.Nodes()[0].Name, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				if v, ok := n.Labels[dep.Key]; ok {
					found = append(found, "label "+v)
				}
				if _, ok := n.Annotations[dep.Key]; ok {
					found = append(found, "annotation")
				}
				for _, tn := range n.Spec.Taints {
					if strings.HasPrefix(tn.Key, v1alpha1.LabelDomain) {
						found = append(found, "taint "+tn.Key)
					}
				}
				mark := pin.MarkKey(dep.Namespace, dep.Instance)
				for _, ref := range dep.Images {
					if l, err := rt.n.ImageLabels(ctx, ref); err != nil || l[mark] != "" {
						found = append(found, fmt.Sprintf("pin of %s (%v)", ref, err))
					}
				}
				found = append(found, remainingObjects(ctx, cs, dep)...)
				return len(found) == 0, strings.Join(found, ", ")
			}
			if err := cluster.Poll(ctx, 250*time.Millisecond, "no mark or object of "+dep.Instance+" left", left); err != nil {
				c.DumpLogs(t)
				t.Fatalf("%.1fs after the deletion: %v", time.Since(start).Seconds(), err)
			}
			took := time.Since(start)
			t.Logf("no label, annotation, taint, pin or object of %s left %.1fs after the deletion", dep.Instance, took.Seconds())
			if took > uninstallBound {
				t.Errorf("took %.1fs, want at most %s", took.Seconds(), uninstallBound)
			}
		})
	}
}

// deployQuickstart deploys examples/quickstart, unchanged, as `make demo`
// does, waits until the node is succeeded with the list pinned and its
// watch runs, and registers a clean-up for a test that fails half-way.
func deployQuickstart(t *testing.T) *demo.Deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	dep, err := demo.Deploy(ctx, c, demo.Options{BinDir: bin, Example: filepath.Join(filepath.Dir(bin), "examples", "quickstart"),
		AgentRef: c.AgentImage(t), Timeout: 3 * time.Minute})
	if dep.Instance != "" {
		t.Cleanup(func() { forceRemove(t, dep) })
	}
	if err != nil {
		c.DumpLogs(t)
		t.Fatal(err)
	}
	waitSummary(t, dep.Instance, "succeeded", 3*time.Minute, func(s label.Summary) bool { return s.Pins != nil && s.Pins.Images > 0 })
	waitWatching(ctx, t, dep.Namespace)
	return dep
}

// kubectlDelete deletes every rendered object as `kubectl delete -f` does:
// one request after another, in the file's order, without waiting.
func kubectlDelete(ctx context.Context, t *testing.T, _ kubernetes.Interface, dep *demo.Deployment) {
	t.Helper()
	del := c.Command(ctx, "kubectl", "delete", "--wait=false", "--ignore-not-found", "-f", "-")
	var out bytes.Buffer
	del.Stdin, del.Stdout, del.Stderr = bytes.NewReader(dep.Rendered), &out, &out
	if err := del.Run(); err != nil {
		t.Fatalf("kubectl delete -f: %v\n%s", err, out.String())
	}
	t.Logf("kubectl delete -f:\n%s", strings.TrimSpace(out.String()))
}

// cleanup runs `image-prefetcher status --cleanup`, with the cluster
// admin's kubeconfig, as docs/install.md tells.
func cleanup(ctx context.Context, t *testing.T, dep *demo.Deployment) {
	t.Helper()
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.Command(ctx, filepath.Join(bin, "image-prefetcher"), "status", "--cleanup", dep.Instance,
		"--namespace", dep.Namespace, "--kubeconfig", c.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("status --cleanup: %v\n%s", err, out)
	}
	t.Logf("status --cleanup:\n%s", strings.TrimSpace(string(out)))
}

// remainingObjects names the rendered objects that still exist: the
// namespace (and so anything in it) and the cluster-scoped ones.
func remainingObjects(ctx context.Context, cs kubernetes.Interface, dep *demo.Deployment) []string {
	var left []string
	for _, o := range dep.Objects {
		var err error
		switch o.GetKind() {
		case "Namespace":
			_, err = cs.CoreV1().Namespaces().Get(ctx, o.GetName(), metav1.GetOptions{})
		case "ClusterRole":
			_, err = cs.RbacV1().ClusterRoles().Get(ctx, o.GetName(), metav1.GetOptions{})
		case "ClusterRoleBinding":
			_, err = cs.RbacV1().ClusterRoleBindings().Get(ctx, o.GetName(), metav1.GetOptions{})
		case "ValidatingAdmissionPolicy":
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, o.GetName(), metav1.GetOptions{})
		case "ValidatingAdmissionPolicyBinding":
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, o.GetName(), metav1.GetOptions{})
		default:
			continue
		}
		if !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("%s %s (%v)", o.GetKind(), o.GetName(), err))
		}
	}
	return left
}

// forceRemove takes away whatever a failed run left: the objects and the
// node key, so that the next test starts clean.
func forceRemove(t *testing.T, dep *demo.Deployment) {
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kubectlDelete(ctx, t, cs, dep)
	if err := cluster.Poll(ctx, 250*time.Millisecond, "namespace "+dep.Namespace+" gone", func() (bool, string) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, dep.Namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	}); err != nil {
		t.Errorf("clean-up: %v", err)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, dep.Key, dep.Key)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, c.Nodes()[0].Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Errorf("clean-up: strip %s: %v", dep.Key, err)
	}
}
