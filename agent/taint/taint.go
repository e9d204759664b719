// Package taint removes an instance's startup taint from the agent's own
// node once this pod's own run found every image of its own list present,
// or, fail-open, once maxWait has passed since the agent's pod first
// started on the node. Nothing else counts: not another instance's
// succeeded on the same key, not one a previous pod wrote.
//
// Instances may share a taint key. Each one that waits for the key
// registers on the node, in its own node key's annotation, that it holds
// the key and until when (label.Summary's StartupTaint and
// StartupTaintDeadline); the key goes once every registered holder is done
// (its label says succeeded) or past its deadline. An agent that registers
// after the taint is gone finds nothing to wait for: the registration is
// written first thing at start, which makes that window short, not empty
// (docs/readiness.md).
//
// It only ever removes taints with its own key, from its own node, with a
// JSON patch that tests the taint list it read: a taint another controller
// adds or changes at the same moment is never lost, the patch fails and is
// computed again. It never adds a taint, so a node that has none is left
// alone, and once the node is seen without the taint it stops looking.
package taint

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Reasons of the Events recorded on the agent's pod, and of the metric.
const (
	// ReasonRemoved: every image is present and the taint is gone.
	ReasonRemoved = "StartupTaintRemoved"
	// ReasonTimeout: maxWait passed with images missing; the taint was
	// removed anyway so that the node takes workloads.
	ReasonTimeout = "StartupTaintTimeout"
)

// Recorder records an Event on the agent's pod.
type Recorder interface {
	Emit(ctx context.Context, eventType, reason, message string)
}

// Observer counts removals by reason.
type Observer interface {
	StartupTaintRemoved(reason string)
}

// Remover watches one node for one startup taint.
type Remover struct {
	Nodes kube.NodeClient
	Node  string
	// Key is the taint key; every taint with it is removed.
	Key string
	// Domain prefixes every instance's node key; the annotations under it
	// name the other holders of Key.
	Domain string
	// LabelKey is the instance's node key, and Owner the instance.
	LabelKey string
	Owner    label.Owner
	// Pod and List identify this pod's run: the pod's UID and the digest
	// of its list. A succeeded on LabelKey lets the taint go only when the
	// annotation says this pod wrote it for this list, for the process
	// that did not see the check itself (watch after fetch). Pod "" never
	// matches.
	Pod, List string
	// MaxWait after Started the taint goes even with images missing; 0
	// keeps it until this pod's run found every image present.
	MaxWait time.Duration
	// Started is when the agent's pod first started on the node.
	Started time.Time
	Events  Recorder
	Metrics Observer
	Log     *slog.Logger
	// Poll is how often Run reads the node while the taint is there (5s by
	// default).
	Poll time.Duration
	// AttemptTimeout bounds one API call (10s by default).
	AttemptTimeout time.Duration
	// Now and Sleep are the clock; tests replace them.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error

	// done: this process's latest check found every image present.
	done atomic.Bool
	// waitingFor is the last set of other holders logged, to log a change
	// once.
	waitingFor string
}

// Done records whether this process's latest check of the list found
// every image present.
func (r *Remover) Done(allPresent bool) { r.done.Store(allPresent) }

func (r *Remover) log() *slog.Logger {
	if r.Log == nil {
		return slog.Default()
	}
	return r.Log
}

func (r *Remover) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

func (r *Remover) sleep(ctx context.Context, d time.Duration) error {
	if r.Sleep != nil {
		return r.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Deadline is when the taint goes even with images missing; zero when
// MaxWait is 0.
func (r *Remover) Deadline() time.Time {
	if r.MaxWait <= 0 {
		return time.Time{}
	}
	return r.Started.Add(r.MaxWait)
}

// Run checks the node until the taint is gone (removed here or by anyone
// else) or ctx ends. Errors are logged and retried with a growing delay.
func (r *Remover) Run(ctx context.Context) {
	wait := time.Duration(0)
	for {
		done, err := r.Step(ctx)
		if done || ctx.Err() != nil {
			return
		}
		next := r.poll()
		if err != nil {
			wait = min(max(2*wait, next), time.Minute)
			next = wait
			r.log().Warn("startup taint: checking the node failed; retrying", "taint", r.Key, "retryIn", next, "err", err)
		} else {
			wait = 0
		}
		// Wake up at the deadline rather than up to a poll late.
		if d := r.Deadline(); !d.IsZero() {
			if until := d.Sub(r.now()); until > 0 && until < next {
				next = until
			}
		}
		if r.sleep(ctx, next) != nil {
			return
		}
	}
}

func (r *Remover) poll() time.Duration {
	if r.Poll <= 0 {
		return 5 * time.Second
	}
	return r.Poll
}

func (r *Remover) attemptTimeout() time.Duration {
	if r.AttemptTimeout <= 0 {
		return 10 * time.Second
	}
	return r.AttemptTimeout
}

// Step reads the node once and removes the taint if its time has come:
// this pod's run is done (or past its deadline), and so is every other
// holder of the key. done is true once the node has no taint with the key.
func (r *Remover) Step(ctx context.Context) (done bool, err error) {
	node, err := r.get(ctx)
	if err != nil {
		return false, err
	}
	if !Has(node, r.Key) {
		r.log().Debug("startup taint: not on the node", "taint", r.Key)
		return true, nil
	}
	now := r.now()
	ready := r.done.Load() || r.wroteSucceeded(node)
	deadline := r.Deadline()
	timedOut := !deadline.IsZero() && !now.Before(deadline)
	if !ready && !timedOut {
		return false, nil
	}
	if others := r.pendingHolders(node, now); len(others) > 0 {
		if w := strings.Join(others, ", "); w != r.waitingFor {
			r.waitingFor = w
			r.log().Info("startup taint: this instance is ready for its removal; waiting for the other instances that hold the same key", "taint", r.Key, "waitingFor", w)
		}
		return false, nil
	}
	removed, err := r.remove(ctx, node)
	if err != nil {
		return false, err
	}
	if !removed {
		return true, nil // someone else removed it meanwhile
	}
	if ready {
		msg := fmt.Sprintf("removed the startup taint %s from node %s: every image is present, %s after the pod first started", r.Key, r.Node, now.Sub(r.Started).Round(time.Second))
		r.log().Info("startup taint removed: every image is present", "taint", r.Key, "sincePodStart", now.Sub(r.Started).Round(time.Millisecond))
		r.emit(ctx, corev1.EventTypeNormal, ReasonRemoved, msg)
		r.observe(ReasonRemoved)
		return true, nil
	}
	msg := fmt.Sprintf("removed the startup taint %s from node %s although images are missing (label %q): maxWait %s has passed since the pod first started at %s, and a node must not stay out of service for a registry outage", r.Key, r.Node, node.Labels[r.LabelKey], r.MaxWait, r.Started.UTC().Format(time.RFC3339))
	r.log().Warn("startup taint removed at maxWait with images missing (fail-open)", "taint", r.Key, "maxWait", r.MaxWait, "label", node.Labels[r.LabelKey])
	r.emit(ctx, corev1.EventTypeWarning, ReasonTimeout, msg)
	r.observe(ReasonTimeout)
	return true, nil
}

// wroteSucceeded reports whether the node's key says succeeded as written
// by this instance, from this pod, for this list.
func (r *Remover) wroteSucceeded(node *corev1.Node) bool {
	if r.Pod == "" || node.Labels[r.LabelKey] != v1alpha1.LabelSucceeded {
		return false
	}
	ann, ok := node.Annotations[r.LabelKey]
	if !ok || !strings.HasPrefix(ann, r.Owner.Prefix()) {
		return false
	}
	s, err := label.Parse(ann)
	return err == nil && s.Pod == r.Pod && s.List == r.List
}

// pendingHolders names the other instances registered on the node as
// holders of the key that are neither done nor past their deadline.
func (r *Remover) pendingHolders(node *corev1.Node, now time.Time) []string {
	var out []string
	for k, ann := range node.Annotations {
		if !strings.HasPrefix(k, r.Domain+"/") || !strings.Contains(ann, r.Key) {
			continue
		}
		s, err := label.Parse(ann)
		if err != nil || s.StartupTaint != r.Key {
			continue
		}
		if k == r.LabelKey && (s.Owner == nil || *s.Owner == r.Owner) {
			continue // this instance's own
		}
		if node.Labels[k] == v1alpha1.LabelSucceeded {
			continue
		}
		if dl, err := time.Parse(time.RFC3339, s.StartupTaintDeadline); err == nil && !now.Before(dl) {
			continue
		}
		who := k
		if s.Owner != nil {
			who = s.Owner.String()
		}
		if s.StartupTaintDeadline != "" {
			who += " (until " + s.StartupTaintDeadline + ")"
		} else {
			who += " (until its images are present: maxWait 0)"
		}
		out = append(out, who)
	}
	slices.Sort(out)
	return out
}

func (r *Remover) emit(ctx context.Context, typ, reason, msg string) {
	if r.Events != nil {
		r.Events.Emit(ctx, typ, reason, msg)
	}
}

func (r *Remover) observe(reason string) {
	if r.Metrics != nil {
		r.Metrics.StartupTaintRemoved(reason)
	}
}

func (r *Remover) get(ctx context.Context) (*corev1.Node, error) {
	actx, cancel := context.WithTimeout(ctx, r.attemptTimeout())
	defer cancel()
	n, err := r.Nodes.Get(actx, r.Node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", r.Node, err)
	}
	return n, nil
}

// maxRemoveAttempts bounds how often one removal is computed again because
// the taints changed under it, or the API failed transiently.
const maxRemoveAttempts = 8

// remove deletes every taint with the key from node, as read. removed is
// false when a fresh read finds none left.
func (r *Remover) remove(ctx context.Context, node *corev1.Node) (removed bool, err error) {
	wait := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if !Has(node, r.Key) {
			return false, nil
		}
		body, err := Patch(node.Spec.Taints, r.Key)
		if err != nil {
			return false, err
		}
		actx, cancel := context.WithTimeout(ctx, r.attemptTimeout())
		_, err = r.Nodes.Patch(actx, r.Node, types.JSONPatchType, body, metav1.PatchOptions{})
		cancel()
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("remove taint %s from node %s: %w", r.Key, r.Node, ctx.Err())
		}
		// The apiserver answers a failed "test" with 422: the taints
		// changed since they were read. Read them again.
		changed := apierrors.IsInvalid(err) || apierrors.IsConflict(err)
		if !changed && !label.Retryable(err) {
			return false, fmt.Errorf("remove taint %s from node %s: %w", r.Key, r.Node, err)
		}
		if attempt == maxRemoveAttempts {
			return false, fmt.Errorf("remove taint %s from node %s: still failing after %d attempts: %w", r.Key, r.Node, attempt, err)
		}
		r.log().Info("startup taint: removal did not apply; reading the node again", "taint", r.Key, "attempt", attempt, "err", err)
		if !changed {
			if r.sleep(ctx, time.Duration(float64(wait)*(0.8+0.4*rand.Float64()))) != nil {
				return false, ctx.Err()
			}
			wait = min(2*wait, 10*time.Second)
		}
		// A failed read ends this removal; Run tries again later.
		if node, err = r.get(ctx); err != nil {
			return false, err
		}
	}
}

// Has reports whether node carries a taint with key.
func Has(node *corev1.Node, key string) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// Patch is the JSON patch that removes every taint with key from taints:
// it tests that the list is still exactly taints, then writes the rest.
func Patch(taints []corev1.Taint, key string) ([]byte, error) {
	var keep []corev1.Taint
	for _, t := range taints {
		if t.Key != key {
			keep = append(keep, t)
		}
	}
	ops := []map[string]any{{"op": "test", "path": "/spec/taints", "value": taints}}
	if len(keep) == 0 {
		ops = append(ops, map[string]any{"op": "remove", "path": "/spec/taints"})
	} else {
		ops = append(ops, map[string]any{"op": "replace", "path": "/spec/taints", "value": keep})
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encode taint patch: %w", err)
	}
	return b, nil
}

// StartedAt returns when the pod first started, recorded in file (in the
// pod's emptyDir, which outlives container restarts but not the pod). The
// first call in a pod writes now. With no file, or one that cannot be
// used, it returns now: the clock then restarts with the container, which
// is later than the truth, never earlier.
func StartedAt(file string, now time.Time) (time.Time, error) {
	if file == "" {
		return now, nil
	}
	if b, err := os.ReadFile(file); err == nil {
		t, perr := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
		if perr == nil {
			return t, nil
		}
		err = fmt.Errorf("read pod start time from %s: %w", file, perr)
		return now, err
	} else if !os.IsNotExist(err) {
		return now, fmt.Errorf("read pod start time: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return now, fmt.Errorf("record pod start time: %w", err)
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(now.UTC().Format(time.RFC3339Nano)+"\n"), 0o644); err != nil {
		return now, fmt.Errorf("record pod start time: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return now, fmt.Errorf("record pod start time: %w", err)
	}
	return now, nil
}
