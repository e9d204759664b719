package pull

import (
	"context"
	"errors"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Class says whether retrying an error can help.
type Class string

const (
	// Transient errors are retried until the overall timeout.
	Transient Class = "transient"
	// Permanent errors are retried at most PermanentAttempts times in total.
	Permanent Class = "permanent"
)

// Reasons reported in the node annotation.
const (
	ReasonNotFound         = "NotFound"
	ReasonUnauthorized     = "Unauthorized"
	ReasonForbidden        = "Forbidden"
	ReasonInvalidReference = "InvalidReference"
	// ReasonPlatformMismatch: the image has no manifest for the node's
	// OS and architecture.
	ReasonPlatformMismatch = "PlatformMismatch"
	// ReasonUnsupported: the runtime refuses the image's format, such as a
	// Docker schema-1 manifest on containerd 2.x.
	ReasonUnsupported = "Unsupported"
	// ReasonRejected: a policy on the node (containerd's image verifier)
	// refused the image.
	ReasonRejected = "Rejected"
	// ReasonShortNameUnresolved: CRI-O found no alias and no search
	// registry for a short name such as "busybox".
	ReasonShortNameUnresolved = "ShortNameUnresolved"
	// ReasonInsufficientDisk: the image filesystem reached the disk
	// ceiling, or the runtime ran out of space. It ends the run's pulls.
	ReasonInsufficientDisk = "InsufficientDisk"
	ReasonTimeout          = "Timeout"
	ReasonPullFailed       = "PullFailed"
	ReasonMissing          = "Missing"
	// ReasonRemoved: the image was present, and left the node since
	// (agent/presence); watch pulls it again.
	ReasonRemoved = "Removed"
	// ReasonRemovedByGC: the image was removed again after watch pulled
	// it back; the node's image GC keeps removing it, and its re-download
	// is held back (agent/gcguard).
	ReasonRemovedByGC = "RemovedByGC"
)

// Verdict is what Explain makes of an error.
type Verdict struct {
	Class  Class
	Reason string
	// Rule names the rule that matched; empty when none did, and the
	// error is transient only because nothing says otherwise.
	Rule string
}

// Unclassified reports an error no rule recognised.
func (v Verdict) Unclassified() bool { return v.Rule == "" }

// rule recognises one kind of error by its gRPC code and the stable part of
// the runtimes' wording. The rules are tried in order.
type rule struct {
	name   string
	class  Class
	reason string
	match  func(code codes.Code, msg string) bool
}

func contains(subs ...string) func(codes.Code, string) bool {
	return func(_ codes.Code, msg string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
}

func matches(re *regexp.Regexp) func(codes.Code, string) bool {
	return func(_ codes.Code, msg string) bool { return re.MatchString(msg) }
}

var (
	// A 401 or 403 while a blob is fetched, after the manifest was read
	// with the same credentials: the object store behind the registry
	// refused a redirect URL that expired or was signed with a skewed
	// clock. The registry grants access; the next attempt gets a new URL.
	blobDenied = regexp.MustCompile(`(?s)(failed to copy|httpReadSeeker|reading blob|fetching blob).*(40[13] Forbidden|40[13] Unauthorized|StatusCode: 40[13]|AccessDenied|\bdenied\b)`)
	// "401 Unauthorized" (containerd), "unauthorized: ..." and
	// "authentication required" (CRI-O, from the registry's error code).
	unauthorized = regexp.MustCompile(`401 Unauthorized|(^|[:\n] ?)unauthorized(: |$)|authentication required|no basic auth credentials|pull access denied, repository does not exist or may require authorization`)
	// "403 Forbidden" (containerd), "denied: ..." and "StatusCode: 403"
	// (CRI-O). Not any "denied": "permission denied" is the node's disk.
	forbidden = regexp.MustCompile(`403 Forbidden|StatusCode: 403|(^|[:\n] ?)denied(: |$)`)
	// Registry statuses worth a retry as containerd ("503 Service
	// Unavailable") and CRI-O ("StatusCode: 503", "toomanyrequests") say them.
	retryableStatus = regexp.MustCompile(`\b(429|5\d\d) [A-Z]|StatusCode: (429|5\d\d)|toomanyrequests|TOOMANYREQUESTS`)
	// CRI-O says which registry it could not reach; containerd says how.
	unreachable = regexp.MustCompile(`connection refused|connection reset|\bEOF\b|i/o timeout|TLS handshake timeout|RegistryUnavailable|no such host|network is unreachable|broken pipe`)
)

var rules = []rule{
	// The node's disk, whatever the registry said before it: permanent
	// for the run (disk.go).
	{"no-space", Permanent, ReasonInsufficientDisk, contains("no space left on device")},
	{"blob-denied", Transient, ReasonForbidden, matches(blobDenied)},
	{"invalid-reference", Permanent, ReasonInvalidReference, contains("invalid reference format", "repository name must be lowercase", "cannot parse input")},
	{"short-name", Permanent, ReasonShortNameUnresolved, contains("did not resolve to an alias")},
	{"platform", Permanent, ReasonPlatformMismatch, contains("no match for platform", "no image found in manifest list for architecture", "no image found in image index for architecture")},
	{"unsupported-format", Permanent, ReasonUnsupported, contains("schema 1 image manifests are no longer supported", "is no longer supported since containerd", "unsupported media type", "unsupported MIME type")},
	{"verifier", Permanent, ReasonRejected, contains("image verifier")},
	{"unauthorized", Permanent, ReasonUnauthorized, matches(unauthorized)},
	{"forbidden", Permanent, ReasonForbidden, matches(forbidden)},
	// containerd reports every 404 as gRPC NotFound; CRI-O as Unknown with
	// the registry's error code.
	{"not-found", Permanent, ReasonNotFound, func(code codes.Code, msg string) bool {
		return code == codes.NotFound || strings.Contains(msg, "manifest unknown") || strings.Contains(msg, "name unknown") || strings.Contains(msg, "blob unknown")
	}},
	{"deadline", Transient, ReasonTimeout, func(code codes.Code, msg string) bool {
		return code == codes.DeadlineExceeded || code == codes.Canceled && strings.Contains(msg, "RST_STREAM")
	}},
	{"rate-limit-or-5xx", Transient, ReasonPullFailed, matches(retryableStatus)},
	{"unreachable", Transient, ReasonPullFailed, matches(unreachable)},
	// The runtime itself is gone (restarting, socket missing).
	{"runtime-unavailable", Transient, ReasonPullFailed, func(code codes.Code, _ string) bool { return code == codes.Unavailable }},
}

// Classify maps a CRI pull error to a class and the reason reported for the
// image; see Explain.
func Classify(err error) (Class, string) {
	v := Explain(err)
	return v.Class, v.Reason
}

// Explain classifies a CRI pull error by its gRPC code and the stable part
// of its message, as containerd 1.6, containerd 2.x and CRI-O word it
// (agent/pull/testdata/errors holds what each really returns). An error no
// rule recognises is transient, since it may well go away (a runtime
// hiccup), with an empty Rule so that the caller can
// report it.
func Explain(err error) Verdict {
	if err == nil {
		return Verdict{}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Verdict{Transient, ReasonTimeout, "deadline"}
	}
	msg := err.Error()
	code := status.Code(unwrapStatus(err))
	for _, r := range rules {
		if r.match(code, msg) {
			return Verdict{r.class, r.reason, r.name}
		}
	}
	return Verdict{Class: Transient, Reason: ReasonPullFailed}
}

// unwrapStatus finds the gRPC status error inside a wrapped chain.
func unwrapStatus(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.(error)
	}
	return err
}
