package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// serviceAccountNamespace is where the kubelet puts the pod's namespace,
// next to its service-account token; client-go's in-cluster config reads
// it too.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// podNamespace is the agent pod's namespace: POD_NAMESPACE (the downward
// API, as the function renders it), else the service-account namespace
// file, which every pod with a token has: the reference tool's manifests
// set no POD_NAMESPACE. "" outside a pod.
func (d *Deps) podNamespace() string {
	if ns := d.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	b, err := os.ReadFile(d.NamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ReasonInstanceMoved is the reason of the Event checkNamespace records.
const ReasonInstanceMoved = "InstanceMoved"

// checkNamespace refuses to run in another namespace than the one the
// instance was rendered for (INSTANCE_NAMESPACE): a namespace: applied
// above the function moves the pod, while its admission policy and the
// mark that policy recognizes it by still name the rendered namespace,
// and two instances moved from one rendering share both. Labeling there
// would act under another instance's identity, so the agent says so on
// its pod, in its log and by its exit code, at start.
func (a *agent) checkNamespace(ctx context.Context, rendered string) error {
	if rendered == "" || a.namespace == "" || rendered == a.namespace {
		return nil
	}
	in := v1alpha1.Instance{Namespace: rendered, Name: a.flags.instance}
	msg := fmt.Sprintf("instance %s was rendered for namespace %s but its pod runs in namespace %s: a namespace: applied after the function moved it, away from its admission policy and RBAC mark; apply namespace: to the ImagePrefetcher before the function runs, and render again", in, rendered, a.namespace)
	a.log.Error("refusing to run: "+msg, "renderedNamespace", rendered, "podNamespace", a.namespace)
	a.events.Emit(ctx, corev1.EventTypeWarning, ReasonInstanceMoved, msg)
	return &ExitCodeError{Code: ExitInstanceMoved, Err: errSilent}
}
