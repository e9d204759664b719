package hits

import (
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet's words, reason Pulled (k8s.io/kubernetes v1.36.3,
// pkg/kubelet/images/image_manager.go; testdata/recorded.json holds them
// as the real kubelet wrote them, and tests/hits checks that it still
// does):
//
//	Container image "IMAGE" already present on machine and can be accessed by the pod
//	Container image "IMAGE" already present on machine
//	Successfully pulled image "IMAGE" in 1.2s (1.2s including waiting). Image size: 123 bytes.
//
// The first is the kubelet's with KubeletEnsureSecretPulledImages on (the
// default from 1.35), the second without. IMAGE is Go-quoted: as the pod
// names it when present, with ":latest" added when pulled.
const (
	reasonPulled  = "Pulled"
	presentPrefix = "Container image "
	presentSuffix = " already present on machine"
	pulledPrefix  = "Successfully pulled image "
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
	var rest string
	switch {
	case strings.HasPrefix(msg, presentPrefix):
		rest, hit = strings.TrimPrefix(msg, presentPrefix), true
	case strings.HasPrefix(msg, pulledPrefix):
		rest = strings.TrimPrefix(msg, pulledPrefix)
	default:
		return "", false, false
	}
	quoted, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false, false
	}
	if hit && !strings.HasPrefix(rest[len(quoted):], presentSuffix) {
		return "", false, false
	}
	image, err = strconv.Unquote(quoted)
	if err != nil || image == "" {
		return "", false, false
	}
	return image, hit, true
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
