package cli

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// ExitOwnerConflict: fetch found its node key owned by another instance of
// the same name, or by another copy of this one, and left it alone.
const ExitOwnerConflict = 4

// ExitInstanceMoved: the pod runs in another namespace than the one the
// instance was rendered for.
const ExitInstanceMoved = 5

// ownerConflict reports a node key that belongs to another instance, loudly
// (an error line naming both owners, a Warning Event on the pod, the
// conflict metric), and tells whether err was such a conflict.
func (a *agent) ownerConflict(ctx context.Context, err error) bool {
	var ce *label.OwnerConflictError
	if !errors.As(err, &ce) {
		return false
	}
	a.log.Error("the node key belongs to another instance of the same name, or to another copy (DaemonSet) of this one; leaving it alone: give each its own instance name",
		"key", ce.Key, "owner", ce.Theirs.String(), "ownerID", ce.Theirs.ID, "ownerDaemonSet", ce.Theirs.DaemonSet,
		"thisInstance", ce.Ours.String(), "thisInstanceID", ce.Ours.ID, "thisDaemonSet", ce.Ours.DaemonSet)
	a.events.Emit(ctx, corev1.EventTypeWarning, events.ReasonInstanceConflict, ce.Error())
	if a.metrics != nil {
		a.metrics.OwnerConflict.Set(1)
	}
	return true
}

// keyWritten records that this instance holds its key again.
func (a *agent) keyWritten() {
	if a.metrics != nil {
		a.metrics.OwnerConflict.Set(0)
	}
}
