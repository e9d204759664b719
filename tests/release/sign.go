package release

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// The names cosign gives a signature (cosign's pkg/oci/static and
// pkg/cosign): what `cosign verify --key` and admission controllers that
// check cosign signatures (Kyverno, sigstore's policy-controller, Connaisseur)
// look for.
const (
	SimpleSigningMediaType types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	SignatureAnnotation                    = "dev.cosignproject.cosign/signature"
)

// LoadSigner reads a private key as `cosign generate-key-pair` writes it
// (PEM "ENCRYPTED SIGSTORE PRIVATE KEY", decrypted with password), or an
// unencrypted PEM private key (password ignored).
func LoadSigner(pemKey, password []byte) (signature.SignerVerifier, error) {
	pf := func(bool) ([]byte, error) { return password, nil }
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(pemKey, pf)
	if err != nil {
		return nil, fmt.Errorf("read signing key: %w", err)
	}
	sv, err := signature.LoadSignerVerifier(priv, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("load signing key: %w", err)
	}
	return sv, nil
}

// AttachmentTag is the tag cosign stores an attachment of digest under in
// the same repository: sha256-<hex>.<suffix> (sig, sbom, att).
func AttachmentTag(d name.Digest, suffix string) name.Tag {
	return d.Context().Tag(strings.Replace(d.DigestStr(), ":", "-", 1) + "." + suffix)
}

// Sign signs the manifest d names the way `cosign sign --key` does without
// a transparency log: a simple-signing payload naming the digest, its
// signature in the layer's annotation, pushed as the sha256-<hex>.sig tag.
// An earlier signature of the same digest is replaced.
func Sign(ctx context.Context, d name.Digest, signer signature.Signer, opts ...remote.Option) error {
	pl, err := payload.Cosign{Image: d}.MarshalJSON()
	if err != nil {
		return fmt.Errorf("signature payload for %s: %w", d, err)
	}
	sig, err := signer.SignMessage(bytes.NewReader(pl))
	if err != nil {
		return fmt.Errorf("sign %s: %w", d, err)
	}
	img, err := attachment(pl, SimpleSigningMediaType, map[string]string{
		SignatureAnnotation: base64.StdEncoding.EncodeToString(sig),
	})
	if err != nil {
		return err
	}
	tag := AttachmentTag(d, "sig")
	if err := remote.Write(tag, img, append([]remote.Option{remote.WithContext(ctx)}, opts...)...); err != nil {
		return fmt.Errorf("push signature %s: %w", tag, err)
	}
	return nil
}

// attachment is cosign's form of an attached blob: an OCI image whose one
// layer is the blob, with the layer annotations given.
func attachment(blob []byte, mt types.MediaType, annotations map[string]string) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(blob, mt),
		Annotations: annotations,
	})
	if err != nil {
		return nil, fmt.Errorf("build attachment: %w", err)
	}
	return img, nil
}
