package hits

import (
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet's words (k8s.io/kubernetes v1.36.3,
// pkg/kubelet/images/image_manager.go; testdata/recorded.json holds them
// as the real kubelet wrote them, and tests/hits checks that it still
// does). Reason Pulled:
//
//	Container image "IMAGE" already present on machine and can be accessed by the pod
//	Container image "IMAGE" already present on machine
//	Successfully pulled image "IMAGE" in 1.2s (1.2s including waiting). Image size: 123 bytes.
//
// The first is the kubelet's with KubeletEnsureSecretPulledImages on (the
// default from 1.35), the second without. Reason Pulling, when a pull
// starts, before its Pulled:
//
//	Pulling image "IMAGE"
//
// IMAGE is Go-quoted: as the pod names it when present, with ":latest"
// added when pulled.
const (
	reasonPulled  = "Pulled"
	reasonPulling = "Pulling"
	presentPrefix = "Container image "
	presentSuffix = " already present on machine"
	pulledPrefix  = "Successfully pulled image "
	pullingPrefix = "Pulling image "
	// The kubelet's event recorder folds the 11th and later Events of one
	// object and reason within 10 minutes into one, under this prefix and
	// the latest message.
	combinedPrefix = "(combined from similar events): "
)

// kubeletPull reads a kubelet Pulled Event: the image, and whether the
// kubelet found it on the node (a hit) or pulled it (a miss). ok is false
// for any other Event.
func kubeletPull(ev *corev1.Event) (image string, hit, ok bool) {
	if ev.Reason != reasonPulled {
		return "", false, false
	}
	msg := strings.TrimPrefix(ev.Message, combinedPrefix)
	if image, rest, ok := quoted(msg, presentPrefix); ok {
		if !strings.HasPrefix(rest, presentSuffix) {
			return "", false, false
		}
		return image, true, true
	}
	image, _, ok = quoted(msg, pulledPrefix)
	return image, false, ok
}

// kubeletPulling reads a kubelet Pulling Event: the image whose pull
// started.
func kubeletPulling(ev *corev1.Event) (image string, ok bool) {
	if ev.Reason != reasonPulling {
		return "", false
	}
	image, _, ok = quoted(strings.TrimPrefix(ev.Message, combinedPrefix), pullingPrefix)
	return image, ok
}

// quoted reads the Go-quoted, non-empty string that follows prefix in msg,
// and returns what follows it.
func quoted(msg, prefix string) (s, rest string, ok bool) {
	rest, found := strings.CutPrefix(msg, prefix)
	if !found {
		return "", "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", "", false
	}
	s, err = strconv.Unquote(q)
	if err != nil || s == "" {
		return "", "", false
	}
	return s, rest[len(q):], true
}

// eventTime is when an Event first happened. The kubelet writes core/v1
// Events, with firstTimestamp (to the second) and no eventTime; writers of
// events.k8s.io/v1 set eventTime instead.
func eventTime(ev *corev1.Event) time.Time {
	switch {
	case !ev.FirstTimestamp.IsZero():
		return ev.FirstTimestamp.Time
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	}
	return ev.CreationTimestamp.Time
}

// eventNode is the node an Event's source ran on.
func eventNode(ev *corev1.Event) string {
	if ev.Source.Host != "" {
		return ev.Source.Host
	}
	return ev.ReportingInstance
}
