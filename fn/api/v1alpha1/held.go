package v1alpha1

// CleanupFinalizer is the finalizer the agent puts on the objects it needs
// to clean its node (Held), so that deleting every rendered object at once
// (kubectl delete -f, a GitOps prune) does not take its credentials and
// permissions away while it removes its node key on SIGTERM. The agents
// take it off again once no node carries the key, or after a deadline
// (docs/install.md#uninstall).
const CleanupFinalizer = LabelDomain + "/node-cleanup"

// HeldObject is one object of an instance that carries CleanupFinalizer
// while its agents run: its API group ("" for core), resource, namespace
// ("" when cluster-scoped) and name.
type HeldObject struct {
	Group, Resource, Namespace, Name string
}

// Path is the object's API path.
func (h HeldObject) Path() string {
	p := "/api/v1/"
	if h.Group != "" {
		p = "/apis/" + h.Group + "/v1/"
	}
	if h.Namespace != "" {
		p += "namespaces/" + h.Namespace + "/"
	}
	return p + h.Resource + "/" + h.Name
}

func (h HeldObject) String() string {
	if h.Namespace == "" {
		return h.Resource + "/" + h.Name
	}
	return h.Resource + "/" + h.Namespace + "/" + h.Name
}

// Held lists the objects whose loss stops the agent's cleanup, under the
// names the function renders (fn/render's NamesFor): the ServiceAccount
// (its pod's token is valid only while it exists), the Role and binding
// that let it find its DaemonSet and hold these objects, and the
// ClusterRole and binding that let it patch its node. The admission policy
// is not held: the agent may not write it, which is what keeps the policy
// out of an agent's reach.
func (i Instance) Held() []HeldObject {
	namespaced := "image-prefetcher-" + i.Name
	cluster := "image-prefetcher." + i.Namespace + "." + i.Name
	const rbac = "rbac.authorization.k8s.io"
	return []HeldObject{
		{Resource: "serviceaccounts", Namespace: i.Namespace, Name: namespaced},
		{Group: rbac, Resource: "roles", Namespace: i.Namespace, Name: namespaced},
		{Group: rbac, Resource: "rolebindings", Namespace: i.Namespace, Name: namespaced},
		{Group: rbac, Resource: "clusterroles", Name: cluster},
		{Group: rbac, Resource: "clusterrolebindings", Name: cluster},
	}
}
