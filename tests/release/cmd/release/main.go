// Command release publishes a release (`make release`, docs/release.md):
// both images as amd64+arm64 indexes pushed to -registry, each signed as
// `cosign sign --key` signs and with a CycloneDX SBOM attached, then -out
// with the function binaries, the digest-pinned manifests and SHA256SUMS.
//
// The signing key comes from COSIGN_PRIVATE_KEY (the PEM text) or -key
// (a file), as `cosign generate-key-pair` writes it, its password from
// COSIGN_PASSWORD. Registry credentials come from REGISTRY_USERNAME and
// REGISTRY_PASSWORD, else from the docker config ($DOCKER_CONFIG or
// ~/.docker/config.json, credential helpers included).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-prefetcher/image-prefetcher/tests/release"
)

func main() {
	src := flag.String("src", ".", "repository root to build from")
	version := flag.String("version", "", "release version (default: the VERSION file of -src)")
	registry := flag.String("registry", envOr("REGISTRY", "ghcr.io/image-prefetcher"),
		"registry and path both images are pushed under (default $REGISTRY or the project's own)")
	out := flag.String("out", "out/release", "directory to (re)create with the release's files")
	work := flag.String("work", "out/release-build", "directory for the intermediate binaries")
	kustomize := flag.String("kustomize", "kustomize", "the standalone kustomize that renders the manifests")
	keyFile := flag.String("key", "", "signing key file (default: the PEM in $COSIGN_PRIVATE_KEY)")
	requireTag := flag.Bool("require-tag", false, "refuse unless the tree is clean and HEAD is tagged v<version>")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, *src, *version, *registry, *out, *work, *kustomize, *keyFile, *requireTag); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, src, version, registry, out, work, kustomize, keyFile string,
	requireTag bool) error {
	if version == "" {
		b, err := os.ReadFile(src + "/VERSION")
		if err != nil {
			return fmt.Errorf("read VERSION: %w", err)
		}
		version = strings.TrimSpace(string(b))
	}
	if requireTag {
		if err := release.CheckTag(ctx, src, version); err != nil {
			return err
		}
	}
	key := []byte(os.Getenv("COSIGN_PRIVATE_KEY"))
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return fmt.Errorf("read signing key: %w", err)
		}
		key = b
	}
	if len(key) == 0 {
		return fmt.Errorf("no signing key: set COSIGN_PRIVATE_KEY (and COSIGN_PASSWORD) or pass -key")
	}
	signer, err := release.LoadSigner(key, []byte(os.Getenv("COSIGN_PASSWORD")))
	if err != nil {
		return err
	}
	reg, err := name.NewRegistry(strings.SplitN(registry, "/", 2)[0])
	if err != nil {
		return fmt.Errorf("registry %q: %w", registry, err)
	}
	res, err := release.Run(ctx, release.Config{
		SrcDir:    src,
		Version:   version,
		Registry:  registry,
		OutDir:    out,
		WorkDir:   work,
		Kustomize: kustomize,
		Signer:    signer,
		Remote:    []remote.Option{remote.WithAuthFromKeychain(release.Keychain(reg.RegistryStr()))},
		Log:       log,
	})
	if err != nil {
		return err
	}
	fmt.Printf("%s\n%s\n", release.Pinned(res.Agent, version), release.Pinned(res.Function, version))
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
