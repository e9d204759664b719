package kube

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// RefusedFor is how long the agent goes on retrying an apiserver that
// refuses it (Refused) before taking the refusal for an answer: a
// restarted apiserver answers 403 until its RBAC caches are filled and
// 401 until its token caches are, for seconds; a Role rendered ahead of
// the pods arrives within that time too. Every caller in the agent uses
// this one span (agent/label, agent/slots).
const RefusedFor = 30 * time.Second

// Refused reports whether err is a refusal by the apiserver: 403
// Forbidden or 401 Unauthorized. Both are retried for RefusedFor.
func Refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
}
