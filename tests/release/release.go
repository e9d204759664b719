// Package release publishes a release from a source tree, with no container
// engine: both images as amd64+arm64 image indexes (built by tests/ociimage),
// pushed to a registry, each signed as cosign signs with a key and with a
// CycloneDX SBOM attached, then the function binaries, the manifests pinned
// to the pushed digests and SHA256SUMS in one directory (`make release`,
// docs/release.md). It is test tooling: neither the agent nor the function
// imports it, so sigstore stays out of both binaries.
package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

// Config is one release.
type Config struct {
	// SrcDir is the repository root the binaries are built from.
	SrcDir  string
	Version string
	// Registry is where both images go: Registry/image-prefetcher and
	// Registry/image-prefetcher-fn, tagged Version.
	Registry string
	// OutDir is (re)created with the release's files; WorkDir holds the
	// intermediate binaries.
	OutDir, WorkDir string
	// Kustomize is the standalone kustomize that renders the manifests.
	Kustomize string
	// Signer signs both indexes; its public key is released as cosign.pub.
	Signer signature.SignerVerifier
	// Remote carries credentials (and, in tests, a transport).
	Remote []remote.Option
	Log    *slog.Logger
}

// Result names what was pushed, by digest.
type Result struct {
	Agent, Function name.Digest
}

// Pinned is the reference a manifest names: repository:version@digest, the
// tag for people, the digest for the runtime.
func Pinned(d name.Digest, version string) string {
	return d.Context().Name() + ":" + version + "@" + d.DigestStr()
}

// Run publishes the release c describes.
func Run(ctx context.Context, c Config) (Result, error) {
	var res Result
	agentRepo := c.Registry + "/image-prefetcher"
	fnRepo := c.Registry + "/image-prefetcher-fn"
	for _, d := range []string{c.OutDir, c.WorkDir} {
		if err := safeToClear(d, c.SrcDir); err != nil {
			return res, err
		}
		if err := os.RemoveAll(d); err != nil {
			return res, fmt.Errorf("clear %s: %w", d, err)
		}
	}
	agentBins, err := c.buildAll(ctx, "./agent/cmd/image-prefetcher", "image-prefetcher", ImagePlatforms,
		map[string]string{"fn/version.Version": c.Version})
	if err != nil {
		return res, err
	}
	if res.Agent, err = c.publish(ctx, agentRepo, ociimage.Agent, agentBins); err != nil {
		return res, err
	}
	// The function renders the agent of its own release by default: the
	// repository it was pushed to, pinned to the digest just pushed.
	fnBins, err := c.buildAll(ctx, "./fn/cmd/image-prefetcher-fn", "image-prefetcher-fn", FunctionPlatforms,
		map[string]string{
			"fn/version.Version":              c.Version,
			"fn/version.AgentImageRepository": agentRepo,
			"fn/version.AgentImageDigest":     res.Agent.DigestStr(),
		})
	if err != nil {
		return res, err
	}
	if res.Function, err = c.publish(ctx, fnRepo, ociimage.Function, fnBins); err != nil {
		return res, err
	}
	if err := c.writeOut(ctx, res, fnBins); err != nil {
		return res, err
	}
	return res, nil
}

// buildAll builds pkg for every platform into WorkDir/<bin>/<os>_<arch>/<bin>.
func (c Config) buildAll(ctx context.Context, pkg, bin string, plats []Platform,
	stamps map[string]string) (map[Platform]string, error) {
	out := map[Platform]string{}
	for _, p := range plats {
		file := filepath.Join(c.WorkDir, bin, p.OS+"_"+p.Arch, bin)
		c.Log.Info("building", "binary", bin, "platform", p.String())
		if err := goBuild(ctx, c.SrcDir, pkg, file, p, stamps); err != nil {
			return nil, err
		}
		out[p] = file
	}
	return out, nil
}

// publish builds the image index of repo from the binaries of the image
// platforms, pushes it as repo:Version, signs it and attaches its SBOM.
func (c Config) publish(ctx context.Context, repo string, spec func(string) ociimage.Spec,
	bins map[Platform]string) (name.Digest, error) {
	tag, err := name.NewTag(repo + ":" + c.Version)
	if err != nil {
		return name.Digest{}, fmt.Errorf("image name %s:%s: %w", repo, c.Version, err)
	}
	var files []string
	var imgs []v1.Image
	for _, p := range ImagePlatforms {
		s := spec(filepath.Dir(bins[p]))
		s.OS, s.Arch = p.OS, p.Arch
		img, err := ociimage.Build(s)
		if err != nil {
			return name.Digest{}, fmt.Errorf("build %s for %s: %w", repo, p, err)
		}
		imgs = append(imgs, img)
		files = append(files, bins[p])
	}
	idx, err := ociimage.Index(imgs...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("index of %s: %w", repo, err)
	}
	h, err := idx.Digest()
	if err != nil {
		return name.Digest{}, fmt.Errorf("digest of %s: %w", repo, err)
	}
	dig := tag.Context().Digest(h.String())
	c.Log.Info("pushing", "image", tag.String(), "digest", h.String())
	if err := remote.WriteIndex(tag, idx, append([]remote.Option{remote.WithContext(ctx)}, c.Remote...)...); err != nil {
		return name.Digest{}, fmt.Errorf("push %s: %w", tag, err)
	}
	if err := Sign(ctx, dig, c.Signer, c.Remote...); err != nil {
		return name.Digest{}, err
	}
	sbom, err := SBOM(tag.String(), c.Version, files...)
	if err != nil {
		return name.Digest{}, err
	}
	if err := AttachSBOM(ctx, dig, sbom, c.Remote...); err != nil {
		return name.Digest{}, err
	}
	return dig, nil
}

// Files of OutDir besides the function binaries.
const (
	FunctionManifest   = "function.yaml"
	QuickstartManifest = "quickstart.yaml"
	ImagesFile         = "images.txt"
	PublicKeyFile      = "cosign.pub"
	SumsFile           = "SHA256SUMS"
)

// FunctionBinary is the name of the function binary of p in OutDir.
func FunctionBinary(p Platform) string { return "image-prefetcher-fn_" + p.OS + "_" + p.Arch }

func (c Config) writeOut(ctx context.Context, res Result, fnBins map[Platform]string) error {
	if err := os.MkdirAll(c.OutDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", c.OutDir, err)
	}
	for _, p := range FunctionPlatforms {
		if err := copyFile(fnBins[p], filepath.Join(c.OutDir, FunctionBinary(p)), 0o755); err != nil {
			return err
		}
	}
	agent, fn := Pinned(res.Agent, c.Version), Pinned(res.Function, c.Version)
	pub, err := c.Signer.PublicKey()
	if err != nil {
		return fmt.Errorf("public key of the signing key: %w", err)
	}
	pubPEM, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		return fmt.Errorf("encode the public key: %w", err)
	}
	files := map[string]string{
		ImagesFile:       agent + "\n" + fn + "\n",
		FunctionManifest: fmt.Sprintf(functionYAML, c.Version, fn),
		PublicKeyFile:    string(pubPEM),
	}
	host, ok := fnBins[Platform{runtime.GOOS, runtime.GOARCH}]
	if !ok {
		return fmt.Errorf("no function binary for this machine (%s/%s) to render the manifests with",
			runtime.GOOS, runtime.GOARCH)
	}
	quickstart, err := c.render(ctx, host, filepath.Join(c.SrcDir, "examples", "quickstart"))
	if err != nil {
		return err
	}
	if !strings.Contains(quickstart, "image: "+agent+"\n") {
		return fmt.Errorf("the released function did not render the released agent image %s", agent)
	}
	files[QuickstartManifest] = quickstart
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(c.OutDir, f), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f, err)
		}
	}
	return writeSums(c.OutDir)
}

// functionYAML declares the released function image as a KRM function for
// kustomize (`transformers:`, as kustomize/base/function does with the
// binary) and shows the same image for a Kptfile pipeline.
const functionYAML = `# image-prefetcher-fn %s as a container KRM function, pinned to the
# digest of the released image index. kustomize: list this file under
# transformers: and build with --enable-alpha-plugins. kpt: use the same
# image in the Kptfile's pipeline (- image: <below>).
apiVersion: v1
kind: ConfigMap
metadata:
  name: image-prefetcher-fn
  annotations:
    config.kubernetes.io/function: |
      container:
        image: %s
`

// render runs kustomize on dir with fn as the image-prefetcher-fn on PATH,
// as users run it (kustomize/base/function).
func (c Config) render(ctx context.Context, fn, dir string) (string, error) {
	binDir := filepath.Join(c.WorkDir, "path")
	if err := copyFile(fn, filepath.Join(binDir, "image-prefetcher-fn"), 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, c.Kustomize, "build", "--enable-alpha-plugins", "--enable-exec", dir)
	cmd.Env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s build %s: %w\n%s", c.Kustomize, dir, err, stderr.String())
	}
	return string(out), nil
}

// writeSums writes SHA256SUMS for every other file of dir, in the format
// `sha256sum -c` checks.
func writeSums(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var lines []string
	for _, e := range entries {
		if e.IsDir() || e.Name() == SumsFile {
			continue
		}
		sum, err := FileSHA256(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+e.Name()+"\n")
	}
	sort.Strings(lines)
	return os.WriteFile(filepath.Join(dir, SumsFile), []byte(strings.Join(lines, "")), 0o644)
}

// FileSHA256 is the hex SHA-256 of a file's content.
func FileSHA256(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", file, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", file, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// safeToClear refuses to recreate a directory that holds the sources (the
// output directories are removed first): ".", "/", the tree or a parent of it.
func safeToClear(dir, src string) error {
	d, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("output directory %q: %w", dir, err)
	}
	s, err := filepath.Abs(src)
	if err != nil {
		return fmt.Errorf("source directory %q: %w", src, err)
	}
	if rel, err := filepath.Rel(d, s); dir == "" || err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("output directory %q holds the sources %s: not removing it", dir, src)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(dst), err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// CheckTag fails unless the tree at srcDir is clean and its HEAD carries the
// tag v<version>: what the CI release job runs from.
func CheckTag(ctx context.Context, srcDir, version string) error {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = srcDir
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return string(out), nil
	}
	status, err := git("status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return err
	}
	if strings.TrimSpace(status) != "" {
		return fmt.Errorf("the tree has uncommitted changes:\n%s", status)
	}
	tags, err := git("tag", "--points-at", "HEAD")
	if err != nil {
		return err
	}
	for _, t := range strings.Fields(tags) {
		if t == "v"+version {
			return nil
		}
	}
	return fmt.Errorf("HEAD is not tagged v%s (VERSION); its tags: %q", version, strings.Fields(tags))
}
