package cli

import (
	"context"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/coverage"
	"github.com/image-prefetcher/image-prefetcher/agent/hold"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// holdTimeout bounds putting the finalizer on the held objects at start.
const holdTimeout = 30 * time.Second

// uninstallWait is how long after its own cleanup an agent whose instance
// is being deleted waits for the other nodes before it releases the held
// objects: within the pod's default grace period of 30 s, and the 60 s a
// pod's token stays valid after its ServiceAccount's deletion.
const uninstallWait = 15 * time.Second

// initHolder sets up the holder of the instance's objects, in a pod that
// labels its node.
func (a *agent) initHolder(client kube.Interface, owner label.Owner) {
	og, ok := client.(kube.ObjectGetter)
	if !ok || a.pod == "" {
		return
	}
	inst := v1alpha1.Instance{Namespace: a.flags.namespace, Name: a.flags.instance}
	a.holder = &hold.Holder{Objects: og.Objects(), Nodes: client.Nodes(), Held: inst.Held(),
		Key: a.labeler.Key, OwnerPrefix: owner.Prefix(), Log: a.log}
}

// holdHeld puts the finalizer on the held objects, in the background: the
// checks do not wait for it. watch does it, not fetch: an agent that never
// gets past fetch (crash looping) must not leave the objects Terminating
// on uninstall, with nobody to release them.
func (a *agent) holdHeld(ctx context.Context) {
	if a.holder == nil {
		return
	}
	go func() {
		hctx, cancel := context.WithTimeout(ctx, holdTimeout)
		defer cancel()
		if err := a.holder.Hold(hctx); err != nil && ctx.Err() == nil {
			a.log.Warn("cannot hold the instance's objects until the nodes are clean: deleting all of them at once may leave node keys (status --cleanup removes them)", "err", err)
		}
	}()
}

// releaseHeld is the last step of an uninstall on SIGTERM, after this
// node's key is gone: when the DaemonSet or its namespace is deleted or
// being deleted (or
// that cannot be told, or no DaemonSet controls the pod), see
// hold.Holder.Settle. A DaemonSet that only stopped covering this node
// still runs agents elsewhere, which need the objects.
func (a *agent) releaseHeld(ctx context.Context) {
	if a.holder == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	octx, cancel := context.WithTimeout(ctx, coverageShare)
	defer cancel()
	_, ds, err := coverage.Own(octx, a.kube, a.namespace, a.pod)
	if err == nil && ds != nil && ds.DeletionTimestamp == nil && !coverage.NamespaceDeleting(octx, a.kube, a.namespace) {
		return
	}
	if err := a.holder.Settle(ctx, time.Now().Add(uninstallWait)); err != nil {
		a.log.Error("releasing the instance's objects failed: once deleted they stay Terminating until released (docs/install.md#uninstall)", "err", err)
	}
}

// releaseStray frees held objects deleted while this agent still runs (see
// hold.Holder.Stray); watch calls it at each check.
func (a *agent) releaseStray(ctx context.Context) {
	if a.holder == nil {
		return
	}
	if err := a.holder.Stray(ctx, time.Now()); err != nil && ctx.Err() == nil {
		a.log.Warn("checking the instance's held objects failed; retrying at the next check", "err", err)
	}
}
