// Package label keeps the per-instance node label and annotation truthful.
// It writes only its own key, with JSON merge patches, so that it can share
// the Node object with everything else that labels nodes.
package label

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// MaxFailures is how many failures the annotation lists; the rest are
// counted in OmittedFailures.
const MaxFailures = 20

// maxMessage and maxImage keep one failure from bloating the Node object:
// an invalid reference given as an argument can be of any length.
const (
	maxMessage = 512
	maxImage   = 512
)

// MaxAnnotationBytes bounds one instance's annotation value. The apiserver
// rejects a Node whose annotations together exceed 256 KiB, and a rejected
// patch would leave the node without a label; 16 KiB leaves room for the
// node's other annotations and for many instances.
const MaxAnnotationBytes = 16 << 10

// Failure is one image that is not present.
type Failure struct {
	Image   string `json:"image"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Summary is the annotation value: what the last check found.
type Summary struct {
	// Owner comes first: the admission policy reads it as a prefix (see
	// Owner.Prefix).
	Owner           *Owner    `json:"owner,omitempty"`
	Total           int       `json:"total"`
	Present         int       `json:"present"`
	Failed          []Failure `json:"failed"`
	OmittedFailures int       `json:"omittedFailures,omitempty"`
	DurationSeconds float64   `json:"durationSeconds"`
	CompletedAt     string    `json:"completedAt"`
	// Pod is the UID of the agent pod that wrote the summary, and List the
	// digest of the list it checked (imagelist.List.Digest): a startup
	// taint goes on a succeeded only when this pod wrote it for this list.
	Pod  string `json:"pod,omitempty"`
	List string `json:"list,omitempty"`
	// StartupTaint is the key of the startup taint the agent removes, so
	// that `status` can tell whether a node still carries it, and so that
	// every other instance removing the same key waits for this one until
	// StartupTaintDeadline (RFC 3339; empty: until its images are present).
	StartupTaint         string `json:"startupTaint,omitempty"`
	StartupTaintDeadline string `json:"startupTaintDeadline,omitempty"`
	// Pins is what the agent pinned on the node (agent/pin); nil when
	// pinning is off.
	Pins *Pins `json:"pins,omitempty"`
	// Disk is the image filesystem against the disk ceiling when the
	// summary was made; nil when its capacity could not be read.
	Disk *Disk `json:"disk,omitempty"`
	// Credentials: the agent pulls with pull secrets or credential
	// plugins, so the list may hold private images, which the kubelet's
	// default policy lets any pod on the node run (docs/security.md).
	Credentials bool `json:"credentials,omitempty"`
	// Removals is the history of the list's images the node lost
	// (agent/gcguard), so that the hold on an image the node's image GC
	// keeps removing outlives the agent's pod.
	Removals []Removal `json:"removals,omitempty"`
}

// Removal is one image's removals from the node.
type Removal struct {
	Image    string `json:"image"`
	Removals int    `json:"removals"`
	// Holds is how many removals held its re-download back, and Until
	// (RFC 3339) when the last hold ends.
	Holds int    `json:"holds,omitempty"`
	Until string `json:"until,omitempty"`
	// Repulled: the agent pulled it back after its last removal. Gone: not
	// seen on the node since its last removal.
	Repulled bool `json:"repulled,omitempty"`
	Gone     bool `json:"gone,omitempty"`
}

// Pins is the pinning part of the annotation.
type Pins struct {
	// Images is how many images of the list are pinned, Bytes what they
	// take on the image filesystem, and BudgetBytes the most they may.
	Images      int    `json:"images"`
	Bytes       uint64 `json:"bytes"`
	BudgetBytes uint64 `json:"budgetBytes"`
	// NotPinned are images present but not pinned, with the reason
	// (OverBudget, PinFailed); the first MaxFailures of them.
	NotPinned        []Failure `json:"notPinned,omitempty"`
	OmittedNotPinned int       `json:"omittedNotPinned,omitempty"`
	// Unsupported says why the runtime cannot pin; nothing is pinned then.
	Unsupported string `json:"unsupported,omitempty"`
	// Error says why the last pass could not pin; the pins stay as they
	// were.
	Error string `json:"error,omitempty"`
}

// NotPin records an image that is present but not pinned.
func (p *Pins) NotPin(image, reason, message string) {
	if len(p.NotPinned) >= MaxFailures {
		p.OmittedNotPinned++
		return
	}
	p.NotPinned = append(p.NotPinned, Failure{Image: truncate(image, maxImage), Reason: reason, Message: truncate(message, maxMessage)})
}

// same reports whether two pin states are the same, ignoring error texts.
func (p *Pins) same(o *Pins) bool {
	if p == nil || o == nil {
		return p == o
	}
	if p.Images != o.Images || p.Bytes != o.Bytes || p.BudgetBytes != o.BudgetBytes || p.Unsupported != o.Unsupported ||
		(p.Error == "") != (o.Error == "") || p.OmittedNotPinned != o.OmittedNotPinned || len(p.NotPinned) != len(o.NotPinned) {
		return false
	}
	for i := range p.NotPinned {
		if p.NotPinned[i].Image != o.NotPinned[i].Image || p.NotPinned[i].Reason != o.NotPinned[i].Reason {
			return false
		}
	}
	return true
}

// SetPins records the pin state, listing fewer images not pinned if the
// annotation would grow past MaxAnnotationBytes.
func (s *Summary) SetPins(p *Pins) {
	if p != nil {
		c := *p
		c.NotPinned = slices.Clone(p.NotPinned)
		p = &c
	}
	s.Pins = p
	for p != nil && len(p.NotPinned) > 0 && len(s.Marshal()) > MaxAnnotationBytes {
		p.NotPinned = p.NotPinned[:len(p.NotPinned)-1]
		p.OmittedNotPinned++
	}
}

// Disk is the image filesystem's usage, as the kubelet counts it, against
// the disk ceiling (agent/disk).
type Disk struct {
	UsedBytes      uint64 `json:"usedBytes"`
	CapacityBytes  uint64 `json:"capacityBytes"`
	CeilingPercent int    `json:"ceilingPercent"`
	// Unknown says why the capacity is unknown: the ceiling then holds
	// nothing back, and only the runtime's out-of-space error stops pulls.
	Unknown string `json:"unknown,omitempty"`
}

// Percent is how full the filesystem is, as the kubelet computes it.
func (d Disk) Percent() int {
	if d.CapacityBytes == 0 || d.UsedBytes > d.CapacityBytes {
		return 0
	}
	return 100 - int((d.CapacityBytes-d.UsedBytes)*100/d.CapacityBytes)
}

// diskDriftPoints is how far, in percentage points, the usage moves
// before the annotation is rewritten for it alone: a label rewrite per
// check for a byte more would load the apiserver for nothing.
const diskDriftPoints = 5

// sameDisk reports whether two readings tell the same story: the same
// ceiling, on the same side of it, within diskDriftPoints.
func sameDisk(a, b *Disk) bool {
	if a == nil || b == nil {
		return a == b
	}
	pa, pb := a.Percent(), b.Percent()
	return a.Unknown == b.Unknown && a.CeilingPercent == b.CeilingPercent && (pa >= a.CeilingPercent) == (pb >= b.CeilingPercent) &&
		pa-pb < diskDriftPoints && pb-pa < diskDriftPoints
}

// NewSummary builds a summary, keeping the first MaxFailures failures.
func NewSummary(total, present int, failures []Failure, d time.Duration, at time.Time) Summary {
	s := Summary{Total: total, Present: present, Failed: []Failure{}, DurationSeconds: float64(d.Round(time.Millisecond)) / float64(time.Second), CompletedAt: at.UTC().Format(time.RFC3339)}
	for i, f := range failures {
		if i >= MaxFailures {
			s.OmittedFailures = len(failures) - MaxFailures
			break
		}
		f.Image = truncate(f.Image, maxImage)
		f.Message = truncate(f.Message, maxMessage)
		s.Failed = append(s.Failed, f)
	}
	// JSON escaping can make a message several times longer than its
	// bytes: the failures listed last are counted instead until it fits.
	for len(s.Failed) > 0 && len(s.Marshal()) > MaxAnnotationBytes {
		s.Failed = s.Failed[:len(s.Failed)-1]
		s.OmittedFailures++
	}
	return s
}

// truncate cuts s to at most limit bytes plus "...", on a rune boundary:
// half a rune is invalid UTF-8, which JSON encoding would turn into U+FFFD.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// FailureCount is the number of failed images, listed or not.
func (s Summary) FailureCount() int { return len(s.Failed) + s.OmittedFailures }

// Value is the label value the summary stands for.
func (s Summary) Value() string {
	if s.FailureCount() == 0 && s.Present == s.Total {
		return v1alpha1.LabelSucceeded
	}
	return v1alpha1.LabelFailed
}

// Text is a one-line human summary, used for Events and logs.
func (s Summary) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d images present in %.1fs", s.Present, s.Total, s.DurationSeconds)
	if n := s.FailureCount(); n > 0 {
		fmt.Fprintf(&b, "; %d failed:", n)
		for i, f := range s.Failed {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s (%s)", f.Image, f.Reason)
		}
		if s.OmittedFailures > 0 {
			fmt.Fprintf(&b, " and %d more", s.OmittedFailures)
		}
	}
	return b.String()
}

// Same reports whether two summaries describe the same state, ignoring
// when and how fast they were computed, and small moves of the disk usage.
func (s Summary) Same(o Summary) bool {
	if (s.Owner == nil) != (o.Owner == nil) || s.Owner != nil && *s.Owner != *o.Owner {
		return false
	}
	if s.Pod != o.Pod || s.List != o.List || s.Credentials != o.Credentials {
		return false
	}
	if !sameDisk(s.Disk, o.Disk) {
		return false
	}
	if s.Total != o.Total || s.Present != o.Present || s.OmittedFailures != o.OmittedFailures || len(s.Failed) != len(o.Failed) {
		return false
	}
	for i := range s.Failed {
		if s.Failed[i].Image != o.Failed[i].Image || s.Failed[i].Reason != o.Failed[i].Reason {
			return false
		}
	}
	return s.Pins.same(o.Pins) && slices.Equal(s.Removals, o.Removals)
}

// Marshal returns the compact JSON of the annotation.
func (s Summary) Marshal() string {
	if s.Failed == nil {
		s.Failed = []Failure{}
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// Parse reads an annotation value.
func Parse(v string) (Summary, error) {
	var s Summary
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return Summary{}, fmt.Errorf("parse summary annotation: %w", err)
	}
	return s, nil
}

// Key returns the label and annotation key of an instance.
func Key(domain, instance string) string {
	if domain == "" {
		domain = v1alpha1.LabelDomain
	}
	return domain + "/" + instance
}

// Labeler writes one instance's label and annotation on one node.
type Labeler struct {
	// Nodes is the API client of Nodes, such as kube.Client.Nodes() or
	// client-go's clientset.CoreV1().Nodes().
	Nodes kube.NodeClient
	Node  string
	Key   string
	// Owner, when set, is written into the annotation, and a key that
	// belongs to another instance is never written or removed (see
	// owner.go). Without it the key is written whoever holds it.
	Owner *Owner
	Log   *slog.Logger
	// RetryFor bounds the retries of transient API errors (2m by default).
	RetryFor time.Duration
	// RefusedFor bounds, within RetryFor, the retries of refusals (403,
	// 401): kube.RefusedFor by default, the span every caller in the agent
	// retries them for.
	RefusedFor time.Duration
	// AttemptTimeout bounds one API call (10s by default).
	AttemptTimeout time.Duration
	// InitialBackoff is the first wait between retries (500ms by default).
	InitialBackoff time.Duration
	// Sleep waits between retries; tests replace it.
	Sleep func(time.Duration)
	// Pod and List, when set, are recorded in every summary written: who
	// wrote it, for which list.
	Pod, List string
	// StartupTaint and its deadline (zero: none), when set, are recorded
	// in every summary written.
	StartupTaint         string
	StartupTaintDeadline time.Time
	// Credentials is recorded in every summary written (Summary.Credentials).
	Credentials bool
	// Removals, when set, gives the history recorded in every summary
	// written (Summary.Removals), the entries that matter most first: the
	// last ones are left out if the annotation would grow past
	// MaxAnnotationBytes.
	Removals func() []Removal
}

func (l *Labeler) log() *slog.Logger {
	if l.Log == nil {
		return slog.Default()
	}
	return l.Log
}

// Apply sets the label to the summary's value and the annotation to the
// summary, retrying transient API errors for up to RetryFor.
func (l *Labeler) Apply(ctx context.Context, s Summary) error {
	s = l.stamp(s)
	patch := map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{l.Key: s.Value()},
		"annotations": map[string]any{l.Key: s.Marshal()},
	}}
	return l.patch(ctx, patch, l.retryFor())
}

// stamp records who writes s, for which list and startup taint.
func (l *Labeler) stamp(s Summary) Summary {
	s.Owner, s.Pod, s.List, s.Credentials = l.Owner, l.Pod, l.List, l.Credentials
	if l.StartupTaint != "" {
		s.StartupTaint = l.StartupTaint
		if !l.StartupTaintDeadline.IsZero() {
			s.StartupTaintDeadline = l.StartupTaintDeadline.UTC().Format(time.RFC3339)
		}
	}
	if l.Removals != nil {
		s.Removals = l.Removals()
		for len(s.Removals) > 0 && len(s.Marshal()) > MaxAnnotationBytes {
			s.Removals = s.Removals[:len(s.Removals)-1]
		}
		slices.SortFunc(s.Removals, func(a, b Removal) int { return strings.Compare(a.Image, b.Image) })
	}
	return s
}

// Stamped is s as Apply writes it, for comparing with what a node holds.
func (l *Labeler) Stamped(s Summary) Summary { return l.stamp(s) }

// Remove deletes the label and annotation, retrying for up to budget.
func (l *Labeler) Remove(ctx context.Context, budget time.Duration) error {
	patch := map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{l.Key: nil},
		"annotations": map[string]any{l.Key: nil},
	}}
	return l.patch(ctx, patch, budget)
}

// Current returns the label value and the parsed annotation on the node.
// ok is false when the label or annotation is missing or unreadable.
func (l *Labeler) Current(ctx context.Context) (value string, s Summary, ok bool, err error) {
	actx, cancel := context.WithTimeout(ctx, l.attemptTimeout())
	defer cancel()
	node, err := l.Nodes.Get(actx, l.Node, metav1.GetOptions{})
	if err != nil {
		return "", Summary{}, false, fmt.Errorf("get node %s: %w", l.Node, err)
	}
	value, hasLabel := node.Labels[l.Key]
	ann, hasAnn := node.Annotations[l.Key]
	if !hasLabel || !hasAnn {
		return value, Summary{}, false, nil
	}
	s, perr := Parse(ann)
	return value, s, perr == nil, nil
}

func (l *Labeler) retryFor() time.Duration {
	if l.RetryFor <= 0 {
		return 2 * time.Minute
	}
	return l.RetryFor
}

func (l *Labeler) refusedFor() time.Duration {
	if l.RefusedFor <= 0 {
		return kube.RefusedFor
	}
	return l.RefusedFor
}

func (l *Labeler) attemptTimeout() time.Duration {
	if l.AttemptTimeout <= 0 {
		return 10 * time.Second
	}
	return l.AttemptTimeout
}

// patch sends a merge patch, retrying transient errors while ctx is live
// and the budget lasts. Each attempt has its own timeout and also ends when
// ctx ends: a rewrite in flight when watch gets SIGTERM must not hold up the
// shutdown for a whole attempt against a hung API server. A cancelled ctx
// therefore gets no attempt at all; callers that must write while shutting
// down (removing the label on SIGTERM) pass a fresh context whose deadline
// is what is left of their shutdown budget.
func (l *Labeler) patch(ctx context.Context, patch map[string]any, budget time.Duration) error {
	body, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encode patch for node %s: %w", l.Node, err)
	}
	deadline := time.Now().Add(budget)
	wait := l.InitialBackoff
	if wait <= 0 {
		wait = 500 * time.Millisecond
	}
	sleep := l.Sleep
	if sleep == nil {
		sleep = func(d time.Duration) {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	}
	var refusedSince time.Time
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			if err == nil {
				return fmt.Errorf("patch node %s: not attempted: %w", l.Node, context.Cause(ctx))
			}
			return fmt.Errorf("patch node %s: stopped retrying: %w", l.Node, err)
		}
		// The last attempt of a budget still gets a second, so that a
		// nearly spent budget does not make a pointless sub-second call;
		// ctx's own deadline, if any, still bounds it.
		timeout := min(l.attemptTimeout(), max(time.Until(deadline), time.Second))
		actx, cancel := context.WithTimeout(ctx, timeout)
		err = l.send(actx, body)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("patch node %s: stopped: %w (%w)", l.Node, context.Cause(ctx), err)
		}
		if refusal(err) && refusedSince.IsZero() {
			refusedSince = time.Now()
		}
		if !Retryable(err) && !(refusal(err) && time.Since(refusedSince) < l.refusedFor()) {
			return fmt.Errorf("patch node %s: %w", l.Node, err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("patch node %s: still failing after %d attempts: %w", l.Node, attempt, err)
		}
		d := min(time.Duration(float64(wait)*(0.8+0.4*rand.Float64())), left)
		l.log().Warn("patching node failed; retrying", "node", l.Node, "attempt", attempt, "retryIn", d.Round(time.Millisecond), "err", err)
		sleep(d)
		wait = min(2*wait, 15*time.Second)
	}
}

// refusal: the apiserver refused us, which a restarted one does for a
// while; an instance that owns the key refuses for good.
func refusal(err error) bool {
	return kube.Refused(err) && !IsOwnerConflict(err)
}

// Retryable reports whether an API error may go away by itself. Errors that
// are the caller's fault (forbidden, invalid, node not found) are not.
func Retryable(err error) bool {
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsInvalid(err),
		apierrors.IsBadRequest(err), apierrors.IsNotFound(err), apierrors.IsMethodNotSupported(err),
		apierrors.IsUnsupportedMediaType(err):
		return false
	case errors.Is(err, context.Canceled), IsOwnerConflict(err):
		return false
	}
	return true
}

// Truncate cuts a message to what the annotation keeps of one.
func Truncate(s string) string { return truncate(s, maxMessage) }
