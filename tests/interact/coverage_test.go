package interact_test

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// A NoExecute taint the DaemonSet does not tolerate: the taint manager
// evicts the agent's pod and the DaemonSet controller creates none in its
// place, so nothing keeps the label true any more. The evicted pod's watch
// must see that, by the controller's own rule, and remove the key (issue
// 26, finding 7).
func untoleratedNoExecuteTaint(t *testing.T) {
	const key = "interact.example.com/evict"
	img := c.PushData(t, 2630, 64<<10, "evict")[0]
	// Narrowed tolerations: everything but the key this test puts on.
	in := deploy(t, &instance{name: "evict", namespace: "interact-evict",
		spec: images(img) + nodeSpec(0) + "  tolerations:\n  - key: interact.example.com/other\n    operator: Exists\n"})
	node := nodeName(0)
	waitNode(t, node, "labeled", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[in.key()] == "succeeded", keyState(n, in.key(), "")
	})
	waitRolledOut(t, in, 1)
	waitWatching(t, in) // its watch removes the key
	taintNode(t, 0, corev1.Taint{Key: key, Value: "x", Effect: corev1.TaintEffectNoExecute})
	waitNode(t, node, "the key gone with the evicted pod", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		_, has := n.Labels[in.key()]
		return !has, keyState(n, in.key(), key)
	})
	// The controller agrees: it wants no pod on the node any more.
	waitDaemonSet(t, in, "no pod wanted on the tainted node", func(ds *appsv1.DaemonSet) bool {
		return ds.Status.ObservedGeneration == ds.Generation && ds.Status.DesiredNumberScheduled == 0
	})
}
