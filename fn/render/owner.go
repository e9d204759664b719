package render

import (
	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// The node key image-prefetcher.stackrox.io/<name> is shared by every
// instance called <name>, whatever its namespace; its annotation names the
// one instance that owns it (see agent/label's Owner). CEL cannot parse
// JSON, so the policy reads the owner the way the agent writes it: as the
// annotation's prefix {"owner":{"namespace":"<ns>","name":"<name>",.
//
// The namespace comes from the request, never from the rendered text: the
// user name of a ServiceAccount token is system:serviceaccount:<ns>:<sa>,
// and kustomize's namespace: above the function moves the ServiceAccount,
// so the user name follows it where a namespace written into the CEL would
// stay behind. The instance name is the one in the key, which no kustomize
// transformer rewrites either.

// ownerVariables are the policy's variables about the key's owner; they
// use variables.key and the annotation maps.
func ownerVariables(name string) []admissionv1.Variable {
	return []admissionv1.Variable{
		{Name: "userParts", Expression: "request.userInfo.username.split(':')"},
		{Name: "agentNamespace", Expression: "variables.userParts.size() == 4 && variables.userParts[0] == 'system' && variables.userParts[1] == 'serviceaccount' ? variables.userParts[2] : ''"},
		{Name: "ownerPrefix", Expression: `'{"owner":{"namespace":"' + variables.agentNamespace + '","name":"` + name + `",'`},
		{Name: "oldAnnotation", Expression: "variables.key in variables.oldAnnotations ? variables.oldAnnotations[variables.key] : ''"},
		// An annotation with an "owner" member that does not begin with
		// this instance's prefix belongs to someone else. Inside a JSON
		// string '"' is escaped, so the match is a member, never text.
		{Name: "ownedByAnother", Expression: `variables.oldAnnotation.matches('"owner"\\s*:') && !variables.oldAnnotation.startsWith(variables.ownerPrefix)`},
		{Name: "keyUnchanged", Expression: "(variables.key in variables.oldLabels) == (variables.key in variables.newLabels) && (!(variables.key in variables.newLabels) || variables.oldLabels[variables.key] == variables.newLabels[variables.key]) && " +
			"(variables.key in variables.oldAnnotations) == (variables.key in variables.newAnnotations) && (!(variables.key in variables.newAnnotations) || variables.oldAnnotations[variables.key] == variables.newAnnotations[variables.key])"},
		{Name: "keyRemoved", Expression: "!(variables.key in variables.newLabels) && !(variables.key in variables.newAnnotations)"},
	}
}

// ownerValidations: the agent writes its key only as its owner, and never
// touches a key another instance owns.
func ownerValidations(key string) []admissionv1.Validation {
	return []admissionv1.Validation{
		{
			Expression: "variables.agentNamespace != ''",
			Message:    "the image prefetcher must authenticate as its ServiceAccount: the namespace in its user name names the owner of " + key,
		},
		{
			Expression: "variables.keyUnchanged || !variables.ownedByAnother",
			Message:    "the key " + key + " belongs to another instance of the same name (its annotation names another owner): this instance may not change or remove it",
		},
		{
			Expression: "variables.keyUnchanged || variables.keyRemoved || (variables.key in variables.newAnnotations && variables.newAnnotations[variables.key].startsWith(variables.ownerPrefix) && " +
				`!variables.newAnnotations[variables.key].substring(size(variables.ownerPrefix)).matches('"owner"\\s*:'))`,
			Message: "the image prefetcher may set " + key + " only with an annotation that names its own namespace and instance as the one owner: {\"owner\":{\"namespace\":\"<its namespace>\",\"name\":\"<instance>\",...},...}",
		},
	}
}
