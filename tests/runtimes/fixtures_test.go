package runtimes_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/pull/errorfixtures"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

var update = flag.Bool("update", false, "rewrite agent/pull/testdata/errors from what the runtimes return")

// Addresses in the run's network namespace besides the registry.
const (
	// objectStoreAddr serves registry.ExpiredObjectStore.
	objectStoreAddr = "127.0.0.1:5001"
	// deadAddr has nothing listening.
	deadAddr = "127.0.0.1:5999"
)

// errCase makes one runtime fail one way. prepare pushes what the case
// needs, switches its faults on, and returns the reference and credentials
// to pull with.
type errCase struct {
	kind string
	only []cluster.Runtime
	// fill: the case runs on a node of its own whose image store it
	// fills (disk_test.go).
	fill    bool
	timeout time.Duration
	prepare func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig)
}

const (
	testUser     = "puller"
	testPassword = "s3cret"
)

func errCases() []errCase {
	reg := func() *registry.Registry { return c.Registry() }
	return []errCase{
		{kind: errorfixtures.NotFoundTag, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("nftag")+":v1", 1)
			return n.ref("nftag", "no-such-tag"), nil
		}},
		{kind: errorfixtures.NotFoundRepo, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			return n.ref("no-such-repo", "v1"), nil
		}},
		{kind: errorfixtures.UnauthorizedAnonymous, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("private")+":v1", 2)
			reg().RequireAuth(n.repo("private"), testUser, testPassword)
			return n.ref("private", "v1"), nil
		}},
		{kind: errorfixtures.UnauthorizedWrongCredentials, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("private2")+":v1", 3)
			reg().RequireAuth(n.repo("private2"), testUser, testPassword)
			return n.ref("private2", "v1"), &runtimeapi.AuthConfig{Username: testUser, Password: "wrong"}
		}},
		{kind: errorfixtures.Forbidden, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("forbidden")+":v1", 4)
			reg().Fail(registry.Match{Repo: n.repo("forbidden"), Kind: registry.Manifests}, 403, 0)
			return n.ref("forbidden", "v1"), nil
		}},
		{kind: errorfixtures.RateLimited, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("ratelimited")+":v1", 5)
			reg().Fail(registry.Match{Repo: n.repo("ratelimited"), Kind: registry.Manifests}, 429, 0)
			return n.ref("ratelimited", "v1"), nil
		}},
		{kind: errorfixtures.Unavailable, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("unavailable")+":v1", 6)
			reg().Fail(registry.Match{Repo: n.repo("unavailable"), Kind: registry.Manifests}, 503, 0)
			return n.ref("unavailable", "v1"), nil
		}},
		{kind: errorfixtures.RegistryDown, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			return deadAddr + "/" + n.repo("down") + ":v1", nil
		}},
		{kind: errorfixtures.InvalidReference, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			return cluster.RegistryAddr + "/" + n.repo("Upper") + ":v1", nil
		}},
		{kind: errorfixtures.PlatformMismatch, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushForeignIndex(ctx, t, n.repo("foreign")+":v1")
			return n.ref("foreign", "v1"), nil
		}},
		{kind: errorfixtures.StalledBlob, timeout: 4 * time.Second, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("stalled")+":v1", 7)
			reg().Stall(registry.Match{Repo: n.repo("stalled")}, 0, 0)
			return n.ref("stalled", "v1"), nil
		}},
		{kind: errorfixtures.BlobRedirectForbidden, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("expired")+":v1", 8)
			reg().RedirectBlobs(registry.Match{Repo: n.repo("expired")}, "http://"+objectStoreAddr, 0)
			return n.ref("expired", "v1"), nil
		}},
		// containerd 2.x refuses schema 1 by media type, before fetching
		// anything. containerd 1.6 and CRI-O convert it, which needs a
		// registry that computes schema-1 digests over the unsigned
		// payload, as distribution does and this registry does not.
		{kind: errorfixtures.Schema1, only: []cluster.Runtime{cluster.Containerd2}, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushSchema1(ctx, t, n.repo("schema1"), "v1")
			return n.ref("schema1", "v1"), nil
		}},
		{kind: errorfixtures.VerifierRejected, only: []cluster.Runtime{cluster.Containerd2}, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			pushData(ctx, t, n.repo("blocked")+":v1", 9)
			blockInVerifier(t, n, n.repo("blocked"))
			return n.ref("blocked", "v1"), nil
		}},
		{kind: errorfixtures.DiskFull, fill: true, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			// One layer larger than the whole store.
			pushLayers(ctx, t, n.repo("too-big")+":v1", 300, smallStoreBytes+32<<20)
			return n.ref("too-big", "v1"), nil
		}},
		{kind: errorfixtures.ShortNameUnresolved, only: []cluster.Runtime{cluster.CRIO}, prepare: func(ctx context.Context, t *testing.T, n *node) (string, *runtimeapi.AuthConfig) {
			// What the kubelet sends for `image: busybox`: no alias, no
			// search registry.
			return "busybox:latest", nil
		}},
	}
}

func (e errCase) runsOn(rt cluster.Runtime) bool {
	if len(e.only) == 0 {
		return true
	}
	for _, r := range e.only {
		if r == rt {
			return true
		}
	}
	return false
}

var (
	digestRE = regexp.MustCompile(`sha256:[0-9a-f]{64}`)
	runDirRE = regexp.MustCompile(`/ipf-e2e/r[0-9]+/n[0-9]+/`)
)

// mask drops what changes from run to run but is not the runtime's
// wording: content digests and the run's directory.
func mask(s string) string {
	return runDirRE.ReplaceAllString(digestRE.ReplaceAllString(s, "sha256:…"), "/ipf-e2e/<run>/<node>/")
}

// TestErrorFixtures pulls each failing case through each real runtime's CRI
// and compares code and message with the recorded fixture (see mask).
// -update
// rewrites the fixtures instead.
func TestErrorFixtures(t *testing.T) {
	startObjectStore(t)
	forEachRuntime(t, func(t *testing.T, n *node) {
		for _, ec := range errCases() {
			if !ec.runsOn(n.rt) {
				continue
			}
			t.Run(ec.kind, func(t *testing.T) {
				n := n
				if ec.fill {
					n = smallNode(t, "fixture", n.rt)
				}
				cri, err := n.node.CRI()
				if err != nil {
					t.Fatal(err)
				}
				defer cri.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				ref, auth := ec.prepare(ctx, t, n)
				timeout := ec.timeout
				if timeout == 0 {
					timeout = 90 * time.Second
				}
				pctx, pcancel := context.WithTimeout(ctx, timeout)
				_, err = cri.Images.PullImage(pctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Auth: auth})
				pcancel()
				got := errorfixtures.Fixture{
					Runtime: string(n.rt), Version: runtimeVersion(n.rt), Kind: ec.kind, Reference: ref,
					Code: status.Code(err).String(),
				}
				if err != nil {
					got.Message = status.Convert(err).Message()
				}
				path := errorfixtures.Path(filepath.Join(repoRoot(), "agent", "pull", "testdata", "errors"), got.Runtime, got.Kind)
				if *update {
					if err := errorfixtures.Write(path, got); err != nil {
						t.Fatal(err)
					}
					t.Logf("%s: %s %q", path, got.Code, got.Message)
					return
				}
				want, err := errorfixtures.Read(path)
				if err != nil {
					t.Fatalf("%v (record it with -update)", err)
				}
				// A deadline's text depends on which side noticed it first.
				same := got.Code == want.Code && got.Version == want.Version &&
					(got.Code == "DeadlineExceeded" || mask(got.Message) == mask(want.Message))
				if !same {
					g, _ := json.MarshalIndent(got, "", "  ")
					t.Errorf("%s %s no longer says what %s records: rerun with -update and review the classifier:\n%s", n.rt, ec.kind, path, g)
				}
			})
		}
	})
}

func runtimeVersion(rt cluster.Runtime) string {
	switch rt {
	case cluster.Containerd2:
		return cluster.Containerd2Version
	case cluster.CRIO:
		return cluster.CRIOVersion
	}
	return containerd16Version()
}

// blockInVerifier installs a containerd image verifier that refuses every
// image of repo and allows the rest.
func blockInVerifier(t *testing.T, n *node, repo string) {
	t.Helper()
	script := fmt.Sprintf(`#!/bin/sh
# Arguments: -name NAME -digest DIGEST -stdin-media-type TYPE
case "$2" in
  *%s*) echo "repository %s is blocked by policy"; exit 1 ;;
esac
exit 0
`, repo, repo)
	if err := os.WriteFile(filepath.Join(n.node.VerifierDir(), "block-repo"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}
