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
	ReasonTimeout          = "Timeout"
	ReasonPullFailed       = "PullFailed"
	ReasonMissing          = "Missing"
)

// Registry status codes as containerd spells them in its messages,
// e.g. "failed with status code [manifests v1]: 503 Service Unavailable".
var retryableStatus = regexp.MustCompile(`\b(429|5\d\d) [A-Z]`)

// Classify maps a CRI pull error to a class and the reason reported for the
// image. containerd 1.6 wraps almost everything in codes.Unknown, so the
// message is matched first and the gRPC code second.
func Classify(err error) (Class, string) {
	if err == nil {
		return "", ""
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "401 Unauthorized"):
		return Permanent, ReasonUnauthorized
	case strings.Contains(msg, "403 Forbidden"):
		return Permanent, ReasonForbidden
	// containerd's resolver says this when a registry still answers 401
	// after a token was fetched: Docker Hub does so for a repository that
	// does not exist and for a private one alike, so a typo in a Docker Hub
	// name lands here. The registry cannot tell the two apart, and a retry
	// gets the same answer.
	case strings.Contains(msg, "pull access denied, repository does not exist or may require authorization"):
		return Permanent, ReasonUnauthorized
	case strings.Contains(msg, "invalid reference format"):
		return Permanent, ReasonInvalidReference
	case strings.Contains(msg, "no match for platform"):
		return Permanent, ReasonPullFailed
	}
	code := status.Code(unwrapStatus(err))
	switch {
	case code == codes.NotFound:
		return Permanent, ReasonNotFound
	case code == codes.DeadlineExceeded, errors.Is(err, context.DeadlineExceeded):
		return Transient, ReasonTimeout
	case code == codes.Unavailable,
		retryableStatus.MatchString(msg),
		strings.Contains(msg, "connection refused"),
		strings.Contains(msg, "connection reset"),
		strings.Contains(msg, "EOF"):
		return Transient, ReasonPullFailed
	}
	// Anything else (disk full while unpacking, a runtime hiccup) may well go
	// away, so it is retried like a transient error rather than given up on.
	return Transient, ReasonPullFailed
}

// unwrapStatus finds the gRPC status error inside a wrapped chain.
func unwrapStatus(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.(error)
	}
	return err
}
