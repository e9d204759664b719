package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

func TestClassifyContainerdMessages(t *testing.T) {
	const ref = "registry.example.com/team/app:1"
	const host = "registry.example.com"
	wrap := func(err error) error { return fmt.Errorf("CRI PullImage %s: %w", ref, err) }
	cases := []struct {
		name   string
		err    error
		class  Class
		reason string
	}{
		// Messages are containerd 1.6.20's, code and text (see fakecri).
		{"missing tag", fakecri.NotFound(ref), Permanent, ReasonNotFound},
		{"missing blob", fakecri.BlobNotFound(ref), Permanent, ReasonNotFound},
		{"401", fakecri.HTTPStatus(ref, host, "401 Unauthorized"), Permanent, ReasonUnauthorized},
		{"403", fakecri.HTTPStatus(ref, host, "403 Forbidden"), Permanent, ReasonForbidden},
		{"docker hub missing or private repository", fakecri.PullAccessDenied("docker.io/library/no-such-repo:1"), Permanent, ReasonUnauthorized},
		{"429", fakecri.HTTPStatus(ref, host, "429 Too Many Requests"), Transient, ReasonPullFailed},
		{"503", fakecri.HTTPStatus(ref, host, "503 Service Unavailable"), Transient, ReasonPullFailed},
		{"500", fakecri.HTTPStatus(ref, host, "500 Internal Server Error"), Transient, ReasonPullFailed},
		{"registry down", fakecri.ConnectionRefused(ref, host+":443"), Transient, ReasonPullFailed},
		{"stall", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), Transient, ReasonTimeout},
		{"malformed reference", fakecri.InvalidReference("Bad::Ref"), Permanent, ReasonInvalidReference},
		{"socket missing", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: no such file or directory"`), Transient, ReasonPullFailed},
		{"platform", fakecri.NoMatchForPlatform(ref), Permanent, ReasonPlatformMismatch},
		{"reset", status.Errorf(codes.Unknown, `failed to pull and unpack image %q: failed to copy: read tcp 1.2.3.4:5->6.7.8.9:443: read: connection reset by peer`, ref), Transient, ReasonPullFailed},
		{"eof", status.Errorf(codes.Unknown, `failed to pull and unpack image %q: failed to copy: unexpected EOF`, ref), Transient, ReasonPullFailed},
		{"local deadline", context.DeadlineExceeded, Transient, ReasonTimeout},
		{"plain eof", io.ErrUnexpectedEOF, Transient, ReasonPullFailed},
		{"disk full", errors.New("failed to extract layer: no space left on device"), Permanent, ReasonInsufficientDisk},
		{"unknown", errors.New("failed to extract layer: input/output error"), Transient, ReasonPullFailed},
	}
	for _, c := range cases {
		for _, err := range []error{c.err, wrap(c.err)} {
			class, reason := Classify(err)
			if class != c.class || reason != c.reason {
				t.Errorf("%s: %v -> (%s, %s), want (%s, %s)", c.name, err, class, reason, c.class, c.reason)
			}
		}
	}
}

func TestContainerdMessagesAreExact(t *testing.T) {
	// The fake must say exactly what containerd says, or the classifier
	// tests prove nothing. The tag is v1, as in the messages recorded from
	// containerd 1.6.20 against a local registry.
	ref := "127.0.0.1:5000/x/y:v1"
	const pinned = "registry.example.com/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const prefix = `failed to pull and unpack image "127.0.0.1:5000/x/y:v1": `
	const resolve = prefix + `failed to resolve reference "127.0.0.1:5000/x/y:v1": `
	cases := []struct {
		name string
		err  error
		code codes.Code
		want string
	}{
		{"401", fakecri.HTTPStatus(ref, "127.0.0.1:5000", "401 Unauthorized"), codes.Unknown,
			`rpc error: code = Unknown desc = ` + resolve + `pulling from host 127.0.0.1:5000 failed with status code [manifests v1]: 401 Unauthorized`},
		{"403", fakecri.HTTPStatus(ref, "127.0.0.1:5000", "403 Forbidden"), codes.Unknown,
			`rpc error: code = Unknown desc = ` + resolve + `pulling from host 127.0.0.1:5000 failed with status code [manifests v1]: 403 Forbidden`},
		{"429", fakecri.HTTPStatus(ref, "127.0.0.1:5000", "429 Too Many Requests"), codes.Unknown,
			`rpc error: code = Unknown desc = ` + resolve + `pulling from host 127.0.0.1:5000 failed with status code [manifests v1]: 429 Too Many Requests`},
		{"503", fakecri.HTTPStatus(ref, "127.0.0.1:5000", "503 Service Unavailable"), codes.Unknown,
			`rpc error: code = Unknown desc = ` + resolve + `pulling from host 127.0.0.1:5000 failed with status code [manifests v1]: 503 Service Unavailable`},
		// containerd's resolver names the path it asked for: the digest of
		// a pinned reference.
		{"401 pinned", fakecri.HTTPStatus(pinned, "registry.example.com", "401 Unauthorized"), codes.Unknown,
			`rpc error: code = Unknown desc = failed to pull and unpack image "` + pinned + `": failed to resolve reference "` + pinned + `": pulling from host registry.example.com failed with status code [manifests sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef]: 401 Unauthorized`},
		// Without hosts.toml, containerd's CRI speaks plain HTTP to a
		// loopback registry.
		{"connection refused", fakecri.ConnectionRefused(ref, "127.0.0.1:5000"), codes.Unknown,
			`rpc error: code = Unknown desc = ` + resolve + `failed to do request: Head "http://127.0.0.1:5000/v2/x/y/manifests/v1": dial tcp 127.0.0.1:5000: connect: connection refused`},
		{"connection refused, docker hub", fakecri.ConnectionRefused("docker.io/library/debian:12", "203.0.113.7:443"), codes.Unknown,
			`rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/library/debian:12": failed to resolve reference "docker.io/library/debian:12": failed to do request: Head "https://registry-1.docker.io/v2/library/debian/manifests/12": dial tcp 203.0.113.7:443: connect: connection refused`},
		{"not found", fakecri.NotFound(ref), codes.NotFound,
			`rpc error: code = NotFound desc = ` + resolve + `127.0.0.1:5000/x/y:v1: not found`},
		// errdefs.ErrNotFound wrapped, so NotFound rather than Unknown.
		{"no match for platform", fakecri.NoMatchForPlatform(ref), codes.NotFound,
			`rpc error: code = NotFound desc = ` + prefix + `no match for platform in manifest: not found`},
		{"invalid reference", fakecri.InvalidReference("Bad::Ref"), codes.Unknown,
			`rpc error: code = Unknown desc = failed to parse image reference "Bad::Ref": invalid reference format: repository name must be lowercase`},
		// Docker Hub, anonymous pull of a repository that does not exist.
		{"pull access denied", fakecri.PullAccessDenied("docker.io/library/no-such-repo:1"), codes.Unknown,
			`rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/library/no-such-repo:1": failed to resolve reference "docker.io/library/no-such-repo:1": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed`},
	}
	for _, c := range cases {
		if got := c.err.Error(); got != c.want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.name, got, c.want)
		}
		if got := status.Code(c.err); got != c.code {
			t.Errorf("%s: code %v, want %v", c.name, got, c.code)
		}
	}
}
