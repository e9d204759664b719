package release_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"debug/elf"
	"debug/macho"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/image-prefetcher/image-prefetcher/tests/registry"
	"github.com/image-prefetcher/image-prefetcher/tests/release"
)

const (
	testUser, testPassword = "releaser", "s3cret"
	keyPassword            = "key-password"
	version                = "9.8.7"
)

// TestRelease runs the release command as CI runs it, against a registry
// that wants credentials, then checks what a user of the release checks:
// the pushed indexes and their platforms, the cosign signatures (with
// sigstore's verifier), the SBOMs, SHA256SUMS, the binaries' platforms and
// that the manifests name the pushed digests.
func TestRelease(t *testing.T) {
	root := repoRoot(t)
	kustomize := filepath.Join(root, "bin", "kustomize")
	if _, err := os.Stat(kustomize); err != nil {
		t.Fatalf("%v: run `make tools` first", err)
	}
	reg := registry.New()
	reg.RequireAuth("prefetch/*", testUser, testPassword)
	addr, stop, err := reg.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := encryptedKeyPEM(t, priv)

	tmp := t.TempDir()
	out := filepath.Join(tmp, "release")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./tests/release/cmd/release",
		"-registry", addr+"/prefetch", "-version", version, "-kustomize", kustomize,
		"-out", out, "-work", filepath.Join(tmp, "work"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "REGISTRY_USERNAME="+testUser, "REGISTRY_PASSWORD="+testPassword,
		"COSIGN_PRIVATE_KEY="+string(keyPEM), "COSIGN_PASSWORD="+keyPassword, "DOCKER_CONFIG="+tmp)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("release: %v\n%s", err, stderr.String())
	}
	t.Logf("release took %s", time.Since(start).Round(time.Second))
	pinned := strings.Fields(string(stdout))
	if len(pinned) != 2 {
		t.Fatalf("release printed %q, want the two pinned images", stdout)
	}
	auth := remote.WithAuth(&authn.Basic{Username: testUser, Password: testPassword})
	images := []struct {
		repo, pinned, module string
	}{
		{"image-prefetcher", pinned[0], "k8s.io/cri-api"},
		{"image-prefetcher-fn", pinned[1], "sigs.k8s.io/kustomize/kyaml"},
	}
	for _, im := range images {
		t.Run(im.repo, func(t *testing.T) {
			tag, err := name.NewTag(addr + "/prefetch/" + im.repo + ":" + version)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := remote.Head(tag); !isUnauthorized(err) {
				t.Fatalf("HEAD %s without credentials: %v, want 401: the registry must ask for them", tag, err)
			}
			idx, err := remote.Index(tag, auth)
			if err != nil {
				t.Fatal(err)
			}
			d, err := idx.Digest()
			if err != nil {
				t.Fatal(err)
			}
			dig := tag.Context().Digest(d.String())
			if want := release.Pinned(dig, version); im.pinned != want {
				t.Fatalf("release printed %s, the tag's index is %s", im.pinned, want)
			}
			m, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			var plats []string
			for _, e := range m.Manifests {
				plats = append(plats, e.Platform.String())
			}
			if !slices.Equal(plats, []string{"linux/amd64", "linux/arm64"}) {
				t.Fatalf("index platforms %q, want linux/amd64 and linux/arm64", plats)
			}
			verifySignature(t, dig, &priv.PublicKey, auth)
			other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			if err := verify(dig, &other.PublicKey, auth); err == nil {
				t.Fatal("the signature verified with another key")
			}
			checkSBOM(t, dig, im.module, auth)
		})
	}
	t.Run("files", func(t *testing.T) { checkFiles(t, out, pinned[0], pinned[1], &priv.PublicKey) })
}

// encryptedKeyPEM is priv as `cosign generate-key-pair` writes cosign.key.
func encryptedKeyPEM(t *testing.T, priv *ecdsa.PrivateKey) []byte {
	der, err := cryptoutils.MarshalPrivateKeyToEncryptedDER(priv, func(bool) ([]byte, error) {
		return []byte(keyPassword), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: string(cryptoutils.EncryptedSigstorePrivateKeyPEMType), Bytes: der})
}

func verifySignature(t *testing.T, dig name.Digest, pub crypto.PublicKey, opts ...remote.Option) {
	t.Helper()
	if err := verify(dig, pub, opts...); err != nil {
		t.Fatal(err)
	}
}

// verify is what `cosign verify --key --insecure-ignore-tlog` checks: the
// sha256-<hex>.sig manifest holds a simple-signing payload whose signature,
// in the layer's annotation, verifies with the public key, and that names
// dig as the signed manifest.
func verify(dig name.Digest, pub crypto.PublicKey, opts ...remote.Option) error {
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return err
	}
	img, err := remote.Image(release.AttachmentTag(dig, "sig"), opts...)
	if err != nil {
		return fmt.Errorf("fetch signature: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) == 0 {
		return errors.New("the signature manifest has no layer")
	}
	for i, l := range layers {
		if m.Layers[i].MediaType != release.SimpleSigningMediaType {
			return fmt.Errorf("signature layer media type %s", m.Layers[i].MediaType)
		}
		sig, err := base64.StdEncoding.DecodeString(m.Layers[i].Annotations[release.SignatureAnnotation])
		if err != nil {
			return fmt.Errorf("signature annotation: %w", err)
		}
		pl, err := readLayer(l)
		if err != nil {
			return err
		}
		if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(pl)); err != nil {
			return fmt.Errorf("signature %d: %w", i, err)
		}
		var p payload.Cosign
		if err := json.Unmarshal(pl, &p); err != nil {
			return fmt.Errorf("signature payload: %w", err)
		}
		if p.Image.DigestStr() != dig.DigestStr() || p.Image.Context().Name() != dig.Context().Name() {
			return fmt.Errorf("the signature is of %s, not %s", p.Image, dig)
		}
	}
	return nil
}

func checkSBOM(t *testing.T, dig name.Digest, module string, opts ...remote.Option) {
	t.Helper()
	img, err := remote.Image(release.AttachmentTag(dig, "sbom"), opts...)
	if err != nil {
		t.Fatalf("fetch SBOM: %v", err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("SBOM layers %d: %v", len(layers), err)
	}
	if mt, err := layers[0].MediaType(); err != nil || mt != release.SBOMMediaType {
		t.Fatalf("SBOM media type %s (%v), want %s", mt, err, release.SBOMMediaType)
	}
	b, err := readLayer(layers[0])
	if err != nil {
		t.Fatal(err)
	}
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(b), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatalf("decode SBOM: %v", err)
	}
	md := bom.Metadata
	if md == nil || md.Component == nil || !strings.HasSuffix(md.Component.Name, ":"+version) {
		t.Fatalf("SBOM describes %+v, want the image tagged %s", bom.Metadata, version)
	}
	found := map[string]string{}
	for _, c := range *bom.Components {
		found[c.Name] = c.PackageURL
	}
	for _, want := range []string{"std", module, "sigs.k8s.io/yaml"} {
		if found[want] == "" {
			t.Errorf("SBOM lists no %s (%d components)", want, len(found))
		}
	}
	if found["github.com/sigstore/sigstore"] != "" {
		t.Error("SBOM lists sigstore: the release tool's dependencies leaked into the product")
	}
}

func checkFiles(t *testing.T, out, agent, fn string, pub crypto.PublicKey) {
	sums, err := os.ReadFile(filepath.Join(out, release.SumsFile))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		got, err := release.FileSHA256(filepath.Join(out, file))
		if err != nil || got != sum {
			t.Fatalf("%s: sha256 %s (%v), SHA256SUMS says %s", file, got, err, sum)
		}
		listed[file] = true
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != release.SumsFile && !listed[e.Name()] {
			t.Errorf("%s is not in SHA256SUMS", e.Name())
		}
	}
	for _, p := range release.FunctionPlatforms {
		file := filepath.Join(out, release.FunctionBinary(p))
		if !listed[release.FunctionBinary(p)] {
			t.Errorf("%s is not released", release.FunctionBinary(p))
		}
		if got := binaryPlatform(t, file); got != p.String() {
			t.Errorf("%s is a %s binary", file, got)
		}
	}
	pubPEM, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	manifests := []struct{ file, want string }{
		{release.PublicKeyFile, string(pubPEM)},
		{release.QuickstartManifest, "image: " + agent + "\n"},
		{release.FunctionManifest, "image: " + fn + "\n"},
		{release.ImagesFile, agent + "\n" + fn + "\n"},
	}
	for _, m := range manifests {
		b, err := os.ReadFile(filepath.Join(out, m.file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), m.want) {
			t.Errorf("%s does not name %q:\n%s", m.file, m.want, b)
		}
	}
}

// binaryPlatform reads os/arch from an executable's header.
func binaryPlatform(t *testing.T, file string) string {
	if f, err := elf.Open(file); err == nil {
		defer f.Close()
		arch := map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}[f.Machine]
		return "linux/" + arch
	}
	f, err := macho.Open(file)
	if err != nil {
		t.Fatalf("%s is neither ELF nor Mach-O: %v", file, err)
	}
	defer f.Close()
	arch := map[macho.Cpu]string{macho.CpuAmd64: "amd64", macho.CpuArm64: "arm64"}[f.Cpu]
	return "darwin/" + arch
}

func readLayer(l interface{ Uncompressed() (io.ReadCloser, error) }) ([]byte, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func isUnauthorized(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == 401
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}
