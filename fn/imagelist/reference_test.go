package imagelist

import (
	// Both binaries link these, so go-digest treats sha256, sha384 and
	// sha512 as available there; the oracle must see the same.
	_ "crypto/sha256"
	_ "crypto/sha512"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/distribution/reference"
)

// The hand-written parser replaced github.com/distribution/reference v0.6.0.
// These tests hold it to that library's answers, error messages included.

type refResult struct {
	err                       string
	domain, path, tag, digest string
	normalized                string
}

// libResult is what distribution/reference makes of s.
func libResult(s string) refResult {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return refResult{err: err.Error()}
	}
	r := refResult{
		domain:     reference.Domain(named),
		path:       reference.Path(named),
		normalized: reference.TagNameOnly(named).String(),
	}
	if t, ok := named.(reference.Tagged); ok {
		r.tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		r.digest = d.Digest().String()
	}
	return r
}

func ownResult(s string) refResult {
	r, err := parseNormalized(s)
	if err != nil {
		return refResult{err: err.Error()}
	}
	return refResult{domain: r.domain, path: r.path, tag: r.tag, digest: r.digest, normalized: r.String()}
}

// The package's exported functions, as they were written on top of the
// library.
func libNormalize(ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("empty image reference")
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return reference.TagNameOnly(named).String(), nil
}

func libPullAlways(ref string) bool {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return false
	}
	if t, ok := named.(reference.Tagged); ok {
		return t.Tag() == "latest"
	}
	_, digested := named.(reference.Digested)
	return !digested
}

func libHost(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return reference.Domain(named), nil
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// checkEquivalent fails t when the parser and the library disagree on s.
func checkEquivalent(t *testing.T, s string) {
	t.Helper()
	if got, want := ownResult(s), libResult(s); got != want {
		t.Fatalf("parse %q:\n got  %+v\n want %+v", s, got, want)
	}
	gn, gerr := Normalize(s)
	wn, werr := libNormalize(s)
	if gn != wn || errString(gerr) != errString(werr) {
		t.Fatalf("Normalize(%q) = %q, %v; library %q, %v", s, gn, gerr, wn, werr)
	}
	gh, gerr := Host(s)
	wh, werr := libHost(s)
	if gh != wh || errString(gerr) != errString(werr) {
		t.Fatalf("Host(%q) = %q, %v; library %q, %v", s, gh, gerr, wh, werr)
	}
	if got, want := PullAlways(s), libPullAlways(s); got != want {
		t.Fatalf("PullAlways(%q) = %v; library %v", s, got, want)
	}
}

var (
	hex64  = strings.Repeat("0123456789abcdef", 4)
	hex96  = strings.Repeat("0123456789abcdef", 6)
	hex128 = strings.Repeat("0123456789abcdef", 8)
)

// equivalenceCases spans the grammar: valid and invalid forms of every
// part, and the normalization rules. Each is also a fuzz seed.
var equivalenceCases = []string{
	// Docker Hub short names and their normalization.
	"", "debian", "debian:12", "debian:latest", "library/debian", "docker.io/debian",
	"docker.io/library/debian", "docker.io/library/debian:latest", "index.docker.io/debian",
	"index.docker.io/library/debian:1", "index.docker.io/org/app", "docker.io/org/app:v1",
	"org/app", "org/team/app:v2", "library/org/app", "docker.io", "index.docker.io",
	"Docker.io/debian", "DOCKER.IO/library/debian", "docker.io/Library/debian",
	// Domains, ports, localhost, IPv6.
	"quay.io/org/app", "ghcr.io/a/b:c", "localhost/app", "localhost:5000/app:1", "localhost",
	"localhost:5000", "127.0.0.1:5000/x/y:v1", "127.0.0.1/x", "registry:5000/app",
	"registry.example.com:443/a/b/c/d:tag", "my-registry.io/app", "-bad.io/app", "bad-.io/app",
	"a.-b.io/x", "a..b/x", ".a.b/x", "a.b./x", "a_b.c/x", "a_b.c/x:1", "a__b.c/x/y", "host:/x",
	"host:port/x", "host:5000:6000/x", "Host/app", "UPPER.IO/app", "uPper/app:1", "a:1/b:2",
	"[::1]/app", "[::1]:5000/app:1", "[fe80::1%25eth0]/x", "[2001:db8::1]:443/org/app@sha256:" + hex64,
	"[]/app", "[::1/app", "[::1]x/app", "[::1]:/app", "[::g]/app", "[::1]:5000", "::1/app",
	"xn--bcher-kva.example/app", "1.2.3.4.5/a", "a/b/c/d/e/f/g/h",
	// Path components and separators.
	"a", "a.b", "a_b", "a__b", "a___b", "a-b", "a--b", "a----b", "a.-b", "a-.b", "a._b", "a_.b",
	"a..b", "_a", "a_", "-lead", "trail-", ".a", "a.", "a/", "/a", "a//b", "org/a_b__c---d.e",
	"org/Case", "Nginx:1", "nginx:1/x", "a b", " a", "a\tb", "a\nb", "héllo", "caf\u00e9/x",
	"\u212a", "debian:\u212a", "\u0130/x", "x/\u0130", "\xff", "a/\xff", "\xff/a", "Bad::Ref",
	"a:", ":a", "a@", "@a", "a:b@", "a/b:c:d",
	// Tags.
	"a:" + strings.Repeat("t", 128), "a:" + strings.Repeat("t", 129), "a:_x", "a:.x", "a:-x",
	"a:X.y-Z_1", "a:v1.2.3", "a:v1+1", "a:UPPER", "debian:LATEST", "a:b/c",
	// Digests.
	"a@sha256:" + hex64, "a@sha256:" + hex64[:63], "a@sha256:" + hex64 + "0",
	"a@sha256:" + strings.ToUpper(hex64), "a@SHA256:" + hex64, "a@sha384:" + hex96,
	"a@sha384:" + hex64, "a@sha512:" + hex128, "a@sha512:" + hex64, "a@md5:" + hex64[:32],
	"a@md5:" + hex64[:31], "a@sha256+b64:" + hex64, "a@Sha256:" + hex64, "a@s-h.a_2+5:" + hex64,
	"a@1sha:" + hex64, "a@sha256:", "a@:" + hex64, "a@sha256:" + hex64 + "@x",
	"a@sha256:" + hex64[:62] + "zz", "a@sha256-:" + hex64, "a@sha256--x:" + hex64,
	"debian:12@sha256:" + hex64, "debian:latest@sha256:" + hex64, "ghcr.io/a/b@sha256:" + hex64,
	"localhost:5000/a:1@sha512:" + hex128, "a:b@sha256:" + hex64[:10],
	// Identifiers (64 lowercase hex) are refused as names.
	hex64, strings.ToUpper(hex64), hex64[:63], hex64 + "0", "a/" + hex64, hex64 + ":1",
	// The 255-character limit counts the path, not the domain.
	strings.Repeat("a", 255), strings.Repeat("a", 256), "org/" + strings.Repeat("a", 251),
	"org/" + strings.Repeat("a", 252), "quay.io/" + strings.Repeat("a", 255),
	"quay.io/" + strings.Repeat("a", 256), strings.Repeat("a", 247), strings.Repeat("a", 248),
	strings.Repeat("a.", 200) + "b:" + strings.Repeat("t", 128),
	strings.Repeat("A", 300), strings.Repeat("a", 300) + ":Tag",
}

func TestEquivalentToDistributionReference(t *testing.T) {
	for _, s := range equivalenceCases {
		t.Run(fmt.Sprintf("%.40q", s), func(t *testing.T) { checkEquivalent(t, s) })
	}
}

// The library's own reasons must survive, since they reach users in
// validation errors and node annotations.
func TestReferenceErrorReasons(t *testing.T) {
	tests := []struct{ in, reason string }{
		{"org/Case", "repository name (org/Case) must be lowercase"},
		{"debian:\u212a", "repository name must be lowercase"},
		{"Bad::Ref", "invalid reference format"},
		{"a@sha256:" + hex64[:63], "invalid checksum digest length"},
		{"a@md5:" + hex64[:32], "unsupported digest algorithm"},
		{strings.Repeat("a", 256), "repository name must not be more than 255 characters"},
		{hex64, "cannot specify 64-byte hexadecimal strings"},
	}
	for _, tc := range tests {
		_, err := Normalize(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Normalize(%q) error = %v, want it to contain %q", tc.in, err, tc.reason)
		}
	}
}

// TestNoRegexpDependency keeps the package (the only importer of an
// image-reference parser in both binaries) free of regular expressions,
// whose compilation at start-up cost the idle agent memory (docs/agent.md,
// Footprint). The tests may import the library; the package may not.
func TestNoRegexpDependency(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test lists the package's dependencies with the go command, which is not on PATH: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 {
		t.Fatalf("go list returned %d packages: %q", len(deps), out)
	}
	for _, p := range deps {
		switch {
		case p == "regexp", strings.HasPrefix(p, "github.com/distribution/"), strings.HasPrefix(p, "github.com/opencontainers/go-digest"):
			t.Errorf("fn/imagelist depends on %s; see docs/agent.md, Footprint", p)
		}
	}
}

func FuzzEquivalent(f *testing.F) {
	for _, s := range equivalenceCases {
		f.Add(s)
	}
	f.Fuzz(checkEquivalent)
}
