package v1alpha1

import "strings"

// Instance identifies one ImagePrefetcher: its namespace and name as the
// function rendered them. Every rendered piece that must tell instances
// apart (the admission policy's mark, the owner of the node key) and the
// agent derive it from these two alone, through the methods below, so that
// both sides always agree.
//
// The node key NodeKey(Name) holds the name only: it is what workloads
// select, so instances of one name in two namespaces share it, and its
// annotation names the one that owns it (OwnerPrefix).
type Instance struct {
	Namespace string
	Name      string
}

func (i Instance) String() string { return i.Namespace + "/" + i.Name }

// Marker is the resource name of the instance's marker rule, the RBAC rule
// by which its admission policy recognizes its agent. It holds a '/', so
// no Kubernetes object can have it as a name and no kustomize name
// reference ever rewrites it.
func (i Instance) Marker() string { return LabelDomain + "/" + i.Namespace + "/" + i.Name }

// OwnerPrefix is how the annotation of a node key owned by the instance
// begins. The admission policy cannot parse JSON, so ownership is decided
// by this prefix, in CEL and in the agent alike: the owner is the first
// member, and namespaces and names hold no character JSON escapes.
func (i Instance) OwnerPrefix() string {
	return `{"owner":{"namespace":"` + i.Namespace + `","name":"` + i.Name + `",`
}

// CopyPrefix is how the annotation of a node key owned by one copy of the
// instance begins: the copy whose DaemonSet is ds (DaemonSetOfPod). A
// rendering applied twice under two kustomize namePrefixes is one
// instance twice; only the DaemonSet names tell the copies apart.
func (i Instance) CopyPrefix(ds string) string {
	return i.OwnerPrefix() + `"daemonSet":"` + ds + `",`
}

// DaemonSetOfPod is the DaemonSet of an agent pod as both the agent and the
// admission policy derive it from the pod's name. The DaemonSet controller
// asks for generateName <daemonset>-, and the apiserver cuts a generateName
// to 58 characters before it appends 5 random ones: a pod name is
// <daemonset>-xxxxx for a DaemonSet name of up to 57 characters, and the
// DaemonSet's first 58 characters then xxxxx for a longer one. Dropping
// the last 5 and then a trailing '-' gives the DaemonSet's name, or for a
// name over 57 characters its first 58 (57 when the 58th is a '-'): the
// same string for every pod of one DaemonSet. "" for a name too short to
// be such a pod's.
func DaemonSetOfPod(pod string) string {
	if len(pod) <= 6 {
		return ""
	}
	return strings.TrimSuffix(pod[:len(pod)-5], "-")
}

// EnvInstanceNamespace names the container variable that tells the agent
// the namespace its instance was rendered for.
const EnvInstanceNamespace = "INSTANCE_NAMESPACE"

// ListDigestAnnotation on the DaemonSet's pod template holds the digest of
// the instance's image list (fn/imagelist's Digest). On SIGTERM the agent
// keeps its node key only while its DaemonSet's current template carries
// the list it checked.
const ListDigestAnnotation = LabelDomain + "/list-digest"

// reservedTaints are the taint keys (a trailing "/" makes a prefix) that
// another controller sets and removes, with that controller: removing one
// would undo its state. The function refuses them as startup taints.
var reservedTaints = []struct{ key, owner string }{
	{"node.kubernetes.io/", "the kubelet and the node lifecycle controller (node conditions)"},
	{"node.alpha.kubernetes.io/", "the node lifecycle controller (deprecated condition taints)"},
	{"node.cloudprovider.kubernetes.io/", "the cloud node controllers (uninitialized, shutdown)"},
	{"node-role.kubernetes.io/", "kubeadm (control-plane nodes)"},
	{"ToBeDeletedByClusterAutoscaler", "the cluster-autoscaler (scale-down in progress)"},
	{"DeletionCandidateOfClusterAutoscaler", "the cluster-autoscaler (scale-down candidate)"},
	{"karpenter.sh/", "Karpenter (karpenter.sh/disrupted, karpenter.sh/unregistered; before v1 karpenter.sh/disruption)"},
	{"node.cilium.io/agent-not-ready", "Cilium (its agent sets it until the node's networking is ready)"},
}

// TaintOwner is the controller that owns taints with key, or "".
func TaintOwner(key string) string {
	for _, r := range reservedTaints {
		if key == r.key || strings.HasSuffix(r.key, "/") && strings.HasPrefix(key, r.key) {
			return r.owner
		}
	}
	return ""
}
