package e2e_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore/pkg/signature"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster/demo"
	"github.com/image-prefetcher/image-prefetcher/tests/release"
)

// Scenario 15: a release of this tree (`make release`'s code, into the
// cluster's registry) installed from its quickstart.yaml as a user
// installs it: every node pulls the agent by the digest the release pushed
// and ends succeeded. tests/release checks the release's signatures, SBOMs
// and files against a registry with authentication.
func Test15ReleasedQuickstart(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	rel := releaseOf(t, version.Version)
	objs, err := demo.Decode(rel.quickstart)
	if err != nil {
		t.Fatal(err)
	}
	name, ns, images, err := demo.Describe(objs)
	if err != nil {
		t.Fatal(err)
	}
	standIns, err := demo.PushStandIns(ctx, c, images, rel.agentRef)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before deploy, so that the instance goes first.
	forgetImages(t, standIns...)
	d := e.deploy(t, instance{Name: name, Namespace: ns}, rel.quickstart)
	for _, o := range d.objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, ct := range cs {
			if img, _, _ := unstructured.NestedString(ct.(map[string]any), "image"); img != rel.agentRef {
				t.Errorf("the released DaemonSet runs %s, want %s", img, rel.agentRef)
			}
		}
	}
	for _, n := range c.Nodes() {
		st := e.waitLabel(t, d, n.Name, "succeeded", labelWait)
		if st.summary.Present != len(images) {
			t.Errorf("%s: %d of %d images present", n.Name, st.summary.Present, len(images))
		}
	}
}

// published is one release of this tree in the cluster's registry.
type published struct {
	version string
	// agent is the agent image index pushed; agentRef names it as the
	// manifests do (repository:version@digest).
	agent    name.Digest
	agentRef string
	// quickstart is the release's quickstart.yaml.
	quickstart []byte
}

var (
	releasesMu sync.Mutex
	releases   = map[string]published{}
)

// releaseOf publishes this tree at version into the cluster's registry
// under /released, with `make release`'s code, once per version and run:
// Test15's release is the upgrade's first one, so that a run of both
// builds two releases, not three. The files are kept in memory; the
// directory goes with the test that made it.
func releaseOf(t *testing.T, ver string) published {
	t.Helper()
	releasesMu.Lock()
	defer releasesMu.Unlock()
	if r, ok := releases[ver]; ok {
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := signature.LoadECDSASignerVerifier(priv, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	out := filepath.Join(tmp, "release")
	start := time.Now()
	res, err := release.Run(ctx, release.Config{
		SrcDir:    repoRoot(),
		Version:   ver,
		Registry:  cluster.RegistryAddr + "/released",
		OutDir:    out,
		WorkDir:   filepath.Join(tmp, "work"),
		Kustomize: filepath.Join(repoRoot(), "bin", "kustomize"),
		Signer:    signer,
		Remote:    []remote.Option{remote.WithTransport(c.RegistryTransport())},
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("release %s: %v", ver, err)
	}
	quickstart, err := os.ReadFile(filepath.Join(out, release.QuickstartManifest))
	if err != nil {
		t.Fatal(err)
	}
	r := published{version: ver, agent: res.Agent, agentRef: release.Pinned(res.Agent, ver), quickstart: quickstart}
	logf(t, "released %s in %.1fs: agent %s", ver, time.Since(start).Seconds(), r.agentRef)
	releases[ver] = r
	return r
}
