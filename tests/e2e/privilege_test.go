package e2e_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// Scenario 10: with the token the kubelet mounted into the agent's pod,
// the agent may write its own key on its own node, and nothing else: the
// rendered ValidatingAdmissionPolicy denies patching another node,
// changing a label or annotation it does not own, and changing
// spec.unschedulable. With the policy removed, RBAC alone lets the same
// requests through, which shows that the policy is what denies them.
func Test10LeastPrivilege(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 1200, 64<<10, "privilege-a")
	in := instance{Name: "privilege", Namespace: "e2e-privilege", Spec: yamlList(refs) + "  refreshInterval: \"0\"\n"}
	d := e.deployInstance(t, in)
	for _, n := range c.Nodes() {
		e.waitLabel(t, d, n.Name, "succeeded", labelWait)
	}
	e.waitRolledOut(t, d, 2)
	own, other := c.Nodes()[0], c.Nodes()[1]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	token := e.podToken(t, ctx, d, own)
	cfg, err := c.RESTConfigForToken(token)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Restore whatever the requests below change, whatever happens.
	orig := map[string]*corev1.Node{}
	for _, n := range c.Nodes() {
		node, err := e.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		orig[n.Name] = node
	}
	t.Cleanup(func() { e.restoreNodes(t, orig, d.key()) })

	pool := "e2e.image-prefetcher.io/pool"
	policy := "image-prefetcher." + d.Namespace + "." + d.Name
	type request struct {
		what, node, patch string
	}
	forbidden := []request{
		{"write its key on another node", other.Name, fmt.Sprintf(`{"metadata":{"labels":{%q:"succeeded"}}}`, d.key())},
		{"change a label it does not own", own.Name, fmt.Sprintf(`{"metadata":{"labels":{%q:"hijacked"}}}`, pool)},
		{"add a label it does not own", own.Name, `{"metadata":{"labels":{"e2e.image-prefetcher.io/intruder":"x"}}}`},
		{"change an annotation it does not own", own.Name, `{"metadata":{"annotations":{"node.alpha.kubernetes.io/ttl":"7"}}}`},
		{"cordon its node (spec.unschedulable)", own.Name, `{"spec":{"unschedulable":true}}`},
	}
	patch := func(r request) error {
		_, err := agent.CoreV1().Nodes().Patch(ctx, r.node, types.MergePatchType, []byte(r.patch), metav1.PatchOptions{})
		return err
	}

	// The token works, and its own key on its own node is allowed.
	allowed := request{"flip its own label", own.Name, fmt.Sprintf(`{"metadata":{"labels":{%q:"failed"}}}`, d.key())}
	if err := patch(allowed); err != nil {
		t.Fatalf("with the pod's token, %s: %v (want allowed)", allowed.what, err)
	}
	for _, r := range forbidden {
		err := patch(r)
		switch {
		case err == nil:
			t.Errorf("with the pod's token, %s was allowed; want denied by %s", r.what, policy)
		case !(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'"):
			t.Errorf("with the pod's token, %s: %v (reason %s); want a denial by ValidatingAdmissionPolicy %s", r.what, err, apierrors.ReasonForError(err), policy)
		default:
			logf(t, "denied as expected (%s): %s: %v", apierrors.ReasonForError(err), r.what, err)
		}
	}

	logf(t, "removing the rendered ValidatingAdmissionPolicy and its binding")
	for _, o := range d.objs {
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			if err := e.deleteObject(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The apiserver drops the policy from its informer shortly after.
	if err := poll(ctx, "the first request to pass without the policy", func() (bool, string) {
		err := patch(forbidden[0])
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
	for _, r := range forbidden[1:] {
		if err := patch(r); err != nil {
			t.Errorf("without the policy, %s: %v; want allowed (RBAC permits node patches)", r.what, err)
		}
	}
}

// podToken reads the service-account token the kubelet mounted into the
// instance's pod on node n, from the pod's volume directory in the
// kubelet's root (inside the node's mount namespace). The agent image has
// no shell, so kubectl exec cannot read it.
func (e env) podToken(t *testing.T, ctx context.Context, d *deployed, n *cluster.Node) string {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + d.Name, FieldSelector: "spec.nodeName=" + n.Name,
	})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the instance's pod on %s: %v (found %d)", n.Name, err, len(pods.Items))
	}
	pod := pods.Items[0]
	glob := filepath.Join(n.Dir, "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "*", "token")
	out, err := n.Command(ctx, "sh", "-c", "cat "+glob).Output()
	if err != nil || len(out) == 0 {
		t.Fatalf("read the token of pod %s at %s: %v", pod.Name, glob, err)
	}
	logf(t, "read the token mounted into pod %s (%d bytes)", pod.Name, len(out))
	return strings.TrimSpace(string(out))
}

// restoreNodes puts labels, annotations and spec.unschedulable back as they
// were, as the admin, and drops the instance's key.
func (e env) restoreNodes(t *testing.T, orig map[string]*corev1.Node, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, o := range orig {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			node, err := e.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			node.Labels = o.Labels
			node.Annotations = o.Annotations
			delete(node.Labels, key)
			delete(node.Annotations, key)
			node.Spec.Unschedulable = o.Spec.Unschedulable
			_, err = e.cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Errorf("restore %s: %v", name, err)
		}
	}
}
