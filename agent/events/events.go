// Package events records the outcome of a run as an Event on the agent's
// own Pod, where `kubectl describe pod` shows it.
package events

import (
	"context"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// Component is the source of the agent's Events (`kubectl describe`'s
// "From"), by which `status --hits` lists them.
const Component = "image-prefetcher"

// Reasons of the Events the agent records.
const (
	ReasonPrefetched     = "Prefetched"
	ReasonPrefetchFailed = "PrefetchFailed"
	// ReasonInstanceConflict: the node key belongs to another instance of
	// the same name, in another namespace; this one leaves it alone.
	ReasonInstanceConflict = "InstanceConflict"
)

// maxMessage is the API server's limit on an Event message.
const maxMessage = 1024

// Recorder records Events on one Pod. A zero Pod name or namespace turns
// it into a no-op, so the agent runs outside a pod too.
type Recorder struct {
	Client kube.Interface
	Pod    string
	// PodUID is the Pod's metadata.uid (POD_UID from the downward API).
	// kubectl describe pod lists only the Events whose involvedObject.uid
	// is the pod's, so without it the Events exist but are not shown.
	PodUID    string
	Namespace string
	Component string
	Host      string
	Log       *slog.Logger
}

// Record creates the Event of a run's outcome. Failures are logged, never
// returned: an Event is a courtesy and must not fail a run.
func (r *Recorder) Record(ctx context.Context, ok bool, message string) {
	typ, reason := corev1.EventTypeNormal, ReasonPrefetched
	if !ok {
		typ, reason = corev1.EventTypeWarning, ReasonPrefetchFailed
	}
	r.Emit(ctx, typ, reason, message)
}

// Emit creates one Event of the given type and reason. Like Record, it
// logs failures and never returns them.
func (r *Recorder) Emit(ctx context.Context, typ, reason, message string) {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	if r.Client == nil || r.Pod == "" || r.Namespace == "" {
		log.Debug("not recording an Event: pod name or namespace unknown (POD_NAME/POD_NAMESPACE unset)", "reason", reason)
		return
	}
	message = truncate(message, maxMessage)
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: r.Pod + ".",
			Namespace:    r.Namespace,
		},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: r.Pod, Namespace: r.Namespace, UID: types.UID(r.PodUID)},
		Reason:         reason,
		Message:        message,
		Type:           typ,
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
		Source:         corev1.EventSource{Component: r.Component, Host: r.Host},
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r.Client.Events(r.Namespace).Create(actx, ev, metav1.CreateOptions{}); err != nil {
		log.Warn("recording Event failed", "pod", fmt.Sprintf("%s/%s", r.Namespace, r.Pod), "reason", reason, "err", err)
	}
}

// truncate shortens s to at most limit bytes, ending in "...". It cuts on a
// rune boundary: half a rune would be invalid UTF-8, which the API server's
// JSON decoding turns into U+FFFD and kubectl shows as garbage.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
