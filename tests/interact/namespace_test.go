package interact_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// referenceManifest is a DaemonSet as the reference tool's deploy
// generator renders it with node labeling (stackrox/image-prefetcher):
// NODE_NAME and INSTANCE_NAME in the fetch container, no POD_NAMESPACE, a
// ClusterRole to label nodes, the sleep main container; here with this
// project's agent image and pinned to one node.
func referenceManifest(ns, instance, node, image, list string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels:
    pod-security.kubernetes.io/enforce: privileged
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: %[2]s
  namespace: %[1]s
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: %[1]s-%[2]s
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: %[1]s-%[2]s
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: %[1]s-%[2]s
subjects:
- kind: ServiceAccount
  name: %[2]s
  namespace: %[1]s
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: %[2]s
  namespace: %[1]s
data:
  images.txt: |
    %[5]s
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: %[2]s
  namespace: %[1]s
spec:
  selector:
    matchLabels:
      app: %[2]s
  template:
    metadata:
      labels:
        app: %[2]s
    spec:
      serviceAccountName: %[2]s
      nodeSelector:
        kubernetes.io/hostname: %[3]s
      tolerations:
      - operator: Exists
      initContainers:
      - name: prefetch
        image: %[4]s
        args: [fetch, --image-list-file=/tmp/list/images.txt, --cri-socket=/tmp/cri/containerd.sock]
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        - name: INSTANCE_NAME
          value: %[2]s
        volumeMounts:
        - name: cri-socket-dir
          mountPath: /tmp/cri
          readOnly: true
        - name: image-list
          mountPath: /tmp/list
          readOnly: true
        securityContext:
          readOnlyRootFilesystem: true
      containers:
      - name: sleep
        image: %[4]s
        args: [sleep]
        securityContext:
          readOnlyRootFilesystem: true
      volumes:
      - name: cri-socket-dir
        hostPath:
          path: /var/run/containerd
      - name: image-list
        configMap:
          name: %[2]s
`, ns, instance, node, image, list)
}

// The reference tool's manifests set no POD_NAMESPACE: the agent takes
// its namespace from the pod's service-account directory and labels the
// node (issue 26, finding 8).
func referenceManifestLabels(t *testing.T) {
	const ns, name = "interact-legacy", "legacy"
	img := c.PushData(t, 2640, 64<<10, "legacy")[0]
	node := nodeName(1)
	manifests := []byte(referenceManifest(ns, name, node, agentRef, img))
	in := &instance{name: name, namespace: ns, manifests: manifests}
	t.Cleanup(func() { remove(t, in) })
	apply(t, manifests)
	n := waitNode(t, node, "labeled", 2*time.Minute, func(n *corev1.Node) (bool, string) {
		return n.Labels[in.key()] == "succeeded", keyState(n, in.key(), "")
	})
	if ann := n.Annotations[in.key()]; !strings.HasPrefix(ann, `{"owner":{"namespace":"`+ns+`","name":"`+name+`",`) {
		t.Errorf("annotation %s, want owned by %s/%s", ann, ns, name)
	}
}

// A namespace: applied above the function moves the agent away from its
// admission policy and RBAC mark: the agent refuses to run, with a Warning
// Event that says why, and writes nothing.
func namespaceAboveTheFunctionIsRefused(t *testing.T) {
	img := c.PushData(t, 2650, 64<<10, "moved")[0]
	in := deploy(t, &instance{name: "moved", namespace: "interact-home", above: "namespace: interact-moved\n", spec: images(img) + nodeSpec(1)})
	in.namespace = "interact-moved"
	ev := waitEvent(t, "interact-moved", "InstanceMoved", 2*time.Minute)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "rendered for namespace interact-home") || !strings.Contains(ev.Message, "runs in namespace interact-moved") {
		t.Errorf("Event %s %q", ev.Type, ev.Message)
	}
	if code := waitInitExit(t, in); code != 5 {
		t.Errorf("fetch exited %d, want 5 (instance moved)", code)
	}
	if _, has := getNode(t, nodeName(1)).Labels[in.key()]; has {
		t.Error("the moved agent labeled the node")
	}
}

// waitInitExit waits, on a watch of the instance's pods, until an init
// container has exited, and returns its exit code.
func waitInitExit(t *testing.T, in *instance) int32 {
	t.Helper()
	code := int32(-1)
	waitPod(t, in, "with an exited init container", func(p *corev1.Pod) bool {
		for _, st := range p.Status.InitContainerStatuses {
			for _, term := range []*corev1.ContainerStateTerminated{st.State.Terminated, st.LastTerminationState.Terminated} {
				if term != nil {
					code = term.ExitCode
					return true
				}
			}
		}
		return false
	})
	return code
}
