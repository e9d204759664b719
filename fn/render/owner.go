package render

import (
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// The node key image-prefetcher.stackrox.io/<name> is shared by every
// instance called <name>, whatever its namespace; its annotation names the
// one instance that owns it (see agent/label's Owner). CEL cannot parse
// JSON, so the policy reads the owner the way the agent writes it: as the
// annotation's prefix, v1alpha1.Instance.CopyPrefix: the instance, then
// the copy (DaemonSet) of it that wrote the key.
//
// The instance is the one rendered, namespace and name. The agent's own
// namespace is in the request (its ServiceAccount's user name
// system:serviceaccount:<ns>:<sa>); the policy requires it to be the
// rendered one. A namespace: applied above the function moves the
// ServiceAccount away from the namespace the mark and the owner were
// rendered for: the policy then denies every write of the moved agent,
// which refuses to run anyway (agent/cli, INSTANCE_NAMESPACE).

// ownerVariables are the policy's variables about the key's owner; they
// use variables.key and the annotation maps.
func ownerVariables(in v1alpha1.Instance) []admissionv1.Variable {
	return []admissionv1.Variable{
		{Name: "userParts", Expression: "request.userInfo.username.split(':')"},
		{Name: "agentNamespace", Expression: "variables.userParts.size() == 4 && variables.userParts[0] == 'system' && variables.userParts[1] == 'serviceaccount' ? variables.userParts[2] : ''"},
		{Name: "instancePrefix", Expression: fmt.Sprintf("'%s'", in.OwnerPrefix())},
		// The agent's copy of the instance: its DaemonSet, derived from
		// the pod-bound token's pod name as the agent derives it
		// (v1alpha1.DaemonSetOfPod), never from a rendered name, which a
		// namePrefix after the function would leave stale.
		{Name: "podNames", Expression: "'authentication.kubernetes.io/pod-name' in request.userInfo.extra ? request.userInfo.extra['authentication.kubernetes.io/pod-name'] : []"},
		{Name: "podBase", Expression: "variables.podNames.size() == 1 && size(variables.podNames[0]) > 6 ? variables.podNames[0].substring(0, size(variables.podNames[0]) - 5) : ''"},
		{Name: "daemonSet", Expression: "variables.podBase.endsWith('-') ? variables.podBase.substring(0, size(variables.podBase) - 1) : variables.podBase"},
		{Name: "ownerPrefix", Expression: `variables.instancePrefix + '"daemonSet":"' + variables.daemonSet + '",'`},
		{Name: "oldAnnotation", Expression: "variables.key in variables.oldAnnotations ? variables.oldAnnotations[variables.key] : ''"},
		// An annotation with an "owner" member that begins with neither
		// this copy's prefix nor this instance's without a copy (an
		// earlier release's) belongs to someone else. Inside a JSON
		// string '"' is escaped, so the match is a member, never text.
		{Name: "ownedByAnother", Expression: `variables.oldAnnotation.matches('"owner"\\s*:') && !variables.oldAnnotation.startsWith(variables.ownerPrefix) && ` +
			`!(variables.oldAnnotation.startsWith(variables.instancePrefix) && !variables.oldAnnotation.substring(size(variables.instancePrefix)).startsWith('"daemonSet":'))`},
		{Name: "keyUnchanged", Expression: "(variables.key in variables.oldLabels) == (variables.key in variables.newLabels) && (!(variables.key in variables.newLabels) || variables.oldLabels[variables.key] == variables.newLabels[variables.key]) && " +
			"(variables.key in variables.oldAnnotations) == (variables.key in variables.newAnnotations) && (!(variables.key in variables.newAnnotations) || variables.oldAnnotations[variables.key] == variables.newAnnotations[variables.key])"},
		{Name: "keyRemoved", Expression: "!(variables.key in variables.newLabels) && !(variables.key in variables.newAnnotations)"},
	}
}

// ownerValidations: the agent runs in the namespace it was rendered for,
// writes its key only as its owner, and never touches a key another
// instance owns.
func ownerValidations(in v1alpha1.Instance) []admissionv1.Validation {
	key := v1alpha1.NodeKey(in.Name)
	return []admissionv1.Validation{
		{
			Expression: fmt.Sprintf("variables.agentNamespace == '%s'", in.Namespace),
			Message: fmt.Sprintf("the image prefetcher %s must run as its ServiceAccount in namespace %s, the namespace it was rendered for: "+
				"a namespace: applied after the function moved it (not supported: apply namespace: to the ImagePrefetcher, before the function runs)", in, in.Namespace),
		},
		{
			Expression: "variables.keyUnchanged || !variables.ownedByAnother",
			Message: "the key " + key + " belongs to another instance of the same name, or to another copy (DaemonSet) of this one (its annotation names another owner): " +
				"this DaemonSet may not change or remove it",
		},
		{
			Expression: "variables.keyUnchanged || variables.keyRemoved || (variables.key in variables.newAnnotations && variables.newAnnotations[variables.key].startsWith(variables.ownerPrefix) && " +
				`!variables.newAnnotations[variables.key].substring(size(variables.ownerPrefix)).matches('"owner"\\s*:'))`,
			Message: fmt.Sprintf("the image prefetcher may set %s only with an annotation that names its instance %s and its DaemonSet as the one owner: %s\"daemonSet\":\"<pod name without its last 5 characters and a trailing '-'>\",...", key, in, in.OwnerPrefix()),
		},
	}
}
