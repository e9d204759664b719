// Package hold keeps the objects an agent needs to clean its node from
// going away before it has: deleting every object of an instance at once
// (kubectl delete -f or -k, an Argo CD or Flux prune) deletes the agent's
// ServiceAccount and RBAC in the same instant as its pods, and a pod that
// gets SIGTERM then can no longer remove its node's label and annotation.
//
// Each agent's watch puts v1alpha1.CleanupFinalizer on its instance's held
// objects (v1alpha1.Instance.Held) as it starts; an object that does not
// exist under its rendered name (renamed after the function ran) is simply
// not held. On SIGTERM, once an agent has cleaned its own node and finds its
// DaemonSet deleted, it waits until no node carries the key of its instance
// (a quorum read, so the last agent to clean sees every other's removal) or
// until a deadline, then takes the finalizer off. Several agents may do that
// at once: removing it is idempotent. The deadline bounds the wait for a
// node whose agent never cleans (a node that is down): its key stays, and
// `status --cleanup` removes it.
package hold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Finalizer is what is put on the held objects.
const Finalizer = v1alpha1.CleanupFinalizer

// Holder holds one instance's objects for its agents.
type Holder struct {
	Objects kube.ObjectClient
	Nodes   kube.NodeClient
	Held    []v1alpha1.HeldObject
	// Key is the instance's node key; a node carries it for this instance
	// while its annotation begins with OwnerPrefix.
	Key, OwnerPrefix string
	Log              *slog.Logger
	// Poll is the wait between two looks at the nodes (500ms when 0).
	Poll time.Duration
}

func (h *Holder) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

// Hold puts the finalizer on every held object that exists, is not being
// deleted, and does not carry it yet. It reports the first error and still
// tries the other objects.
func (h *Holder) Hold(ctx context.Context) error {
	var errs []error
	for _, o := range h.Held {
		if err := h.edit(ctx, o, true); err != nil {
			errs = append(errs, fmt.Errorf("hold %s: %w", o, err))
		}
	}
	return errors.Join(errs...)
}

// Deleting lists the held objects that are being deleted, deleted before
// (zero: any time), and still carry the finalizer: what Release would free.
func (h *Holder) Deleting(ctx context.Context, before time.Time) ([]v1alpha1.HeldObject, error) {
	var out []v1alpha1.HeldObject
	for _, o := range h.Held {
		m, err := h.Objects.Meta(ctx, o.Path())
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("read %s: %w", o, err)
		}
		if m.DeletionTimestamp == nil || !before.IsZero() && !m.DeletionTimestamp.Time.Before(before) {
			continue
		}
		if slices.Contains(m.Finalizers, Finalizer) {
			out = append(out, o)
		}
	}
	return out, nil
}

// Release takes the finalizer off objs. It reports the first error and
// still tries the other objects.
func (h *Holder) Release(ctx context.Context, objs []v1alpha1.HeldObject) error {
	var errs []error
	for _, o := range objs {
		if err := h.edit(ctx, o, false); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", o, err))
		}
	}
	return errors.Join(errs...)
}

// Remaining counts the nodes that still carry the instance's key, by a
// quorum read.
func (h *Holder) Remaining(ctx context.Context) ([]string, error) {
	list, err := h.Nodes.List(ctx, metav1.ListOptions{LabelSelector: h.Key})
	if err != nil {
		return nil, fmt.Errorf("list nodes carrying %s: %w", h.Key, err)
	}
	var left []string
	for _, n := range list.Items {
		if strings.HasPrefix(n.Annotations[h.Key], h.OwnerPrefix) {
			left = append(left, n.Name)
		}
	}
	return left, nil
}

// Settle is what an agent whose node is clean does on SIGTERM when its
// DaemonSet is deleted or being deleted: it waits until no node carries the
// key or until deadline, then releases every held object. The objects may
// be deleted in the same instant (everything deleted at once), or later
// (the DaemonSet first, as a careful hand or a sync wave does): once the
// DaemonSet is gone no agent is left to release them then, so they are
// released now. A DaemonSet applied again holds them again as its agents
// start.
func (h *Holder) Settle(ctx context.Context, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	left := h.wait(wctx)
	cancel()
	if len(left) > 0 {
		h.log().Warn("releasing the instance's objects although nodes still carry its key: their agents did not clean them in time (status --cleanup removes it)",
			"key", h.Key, "nodes", left)
	} else {
		h.log().Info("no node carries the instance's key any more; releasing its objects", "key", h.Key)
	}
	rctx, rcancel := context.WithTimeout(ctx, releaseTimeout)
	defer rcancel()
	return h.Release(rctx, h.Held)
}

// Stray releases held objects deleted more than strayAfter ago while the
// agent still runs: an object deleted alone (replaced, or pruned because a
// release renamed it) must not stay Terminating. An uninstall sends SIGTERM
// to the agents within seconds, and Settle handles it.
func (h *Holder) Stray(ctx context.Context, now time.Time) error {
	deleting, err := h.Deleting(ctx, now.Add(-strayAfter))
	if err != nil || len(deleting) == 0 {
		return err
	}
	h.log().Warn("releasing objects of the instance deleted while its agent still runs", "objects", fmt.Sprint(deleting))
	return h.Release(ctx, deleting)
}

// strayAfter is how long a held object may be Terminating while the agent
// runs before Stray releases it.
const strayAfter = time.Minute

// releaseTimeout bounds releasing after the wait has used the deadline up.
const releaseTimeout = 3 * time.Second

// wait polls the nodes until none carries the key or ctx ends, and returns
// those still carrying it (unknown: nil only when none was seen).
func (h *Holder) wait(ctx context.Context) []string {
	poll := h.Poll
	if poll == 0 {
		poll = 500 * time.Millisecond
	}
	var left []string
	for {
		got, err := h.Remaining(ctx)
		switch {
		case err == nil && len(got) == 0:
			return nil
		case err == nil:
			left = got
		case ctx.Err() == nil:
			h.log().Warn("listing the nodes that carry the key failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			if left == nil {
				left = []string{"(unknown)"}
			}
			return left
		case <-time.After(poll):
		}
	}
}

// conflictRetries bounds retries of an edit that lost a race with another
// writer of the object.
const conflictRetries = 5

// edit adds (hold) or removes the finalizer on o, against the
// resourceVersion it read: a merge patch replaces the whole list.
func (h *Holder) edit(ctx context.Context, o v1alpha1.HeldObject, hold bool) error {
	for range conflictRetries {
		m, err := h.Objects.Meta(ctx, o.Path())
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		has := slices.Contains(m.Finalizers, Finalizer)
		if hold == has || hold && m.DeletionTimestamp != nil {
			return nil
		}
		fin := slices.DeleteFunc(slices.Clone(m.Finalizers), func(f string) bool { return f == Finalizer })
		if hold {
			fin = append(fin, Finalizer)
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": m.ResourceVersion, "finalizers": fin}})
		if err != nil {
			return err
		}
		err = h.Objects.MergePatch(ctx, o.Path(), patch)
		if apierrors.IsConflict(err) {
			continue
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	return fmt.Errorf("%s kept changing under %d attempts", o, conflictRetries)
}
