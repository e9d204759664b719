package pull

import (
	"path/filepath"
	"testing"

	"google.golang.org/grpc/status"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	ef "github.com/image-prefetcher/image-prefetcher/agent/pull/errorfixtures"
)

// fakecri's containerd 1.6 errors, which the fake-CRI tests of fetch and
// watch rely on, say exactly what the real containerd 1.6.20 said for the
// same reference (agent/pull/testdata/errors/containerd-1.6).
func TestFakeCRIMatchesRecordedContainerd16(t *testing.T) {
	const host = "127.0.0.1:5000"
	for kind, fake := range map[string]func(ref string) error{
		ef.NotFoundTag:           fakecri.NotFound,
		ef.UnauthorizedAnonymous: func(ref string) error { return fakecri.HTTPStatus(ref, host, "401 Unauthorized") },
		ef.Forbidden:             func(ref string) error { return fakecri.HTTPStatus(ref, host, "403 Forbidden") },
		ef.RateLimited:           func(ref string) error { return fakecri.HTTPStatus(ref, host, "429 Too Many Requests") },
		ef.Unavailable:           func(ref string) error { return fakecri.HTTPStatus(ref, host, "503 Service Unavailable") },
		ef.RegistryDown:          func(ref string) error { return fakecri.ConnectionRefused(ref, "127.0.0.1:5999") },
		ef.InvalidReference:      fakecri.InvalidReference,
		ef.PlatformMismatch:      fakecri.NoMatchForPlatform,
	} {
		f, err := ef.Read(ef.Path(fixturesDir, "containerd-1.6", kind))
		if err != nil {
			t.Fatal(err)
		}
		got := status.Convert(fake(f.Reference))
		if got.Code().String() != f.Code || got.Message() != f.Message {
			t.Errorf("%s (%s):\nfakecri  %s %s\nrecorded %s %s", kind, filepath.Base(f.Reference), got.Code(), got.Message(), f.Code, f.Message)
		}
	}
}
