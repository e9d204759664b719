package imagelist

import (
	"errors"
	"fmt"
	"strings"
)

// This file checks the image-reference grammar by hand. It accepts and
// rejects exactly what github.com/distribution/reference v0.6.0 does (with
// sha256, sha384 and sha512 digests available, as in both binaries), and
// keeps its error messages, which the differential test and fuzz target in
// reference_test.go prove. The library compiles its large regular
// expressions when the program starts; that cost about 1.3 MiB of the
// agent's idle memory and a third of the function's render time.
//
// The grammar, in the library's terms:
//
//	reference  := name [ ":" tag ] [ "@" digest ]
//	name       := [ domain "/" ] component ( "/" component )*
//	domain     := ( label ( "." label )* | "[" [a-fA-F0-9:]+ "]" ) [ ":" [0-9]+ ]
//	label      := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//	component  := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
//	tag        := [\w][\w.-]{0,127}
//	digest     := algorithm ":" [0-9a-fA-F]{32,}
//	algorithm  := [A-Za-z][A-Za-z0-9]* ( [-_+.] [A-Za-z][A-Za-z0-9]* )*
//
// No part of a name after its domain holds ':' or '@', a tag holds neither
// ':' nor '/' nor '@', and a digest holds no '/' or '@'. So the split into
// name, tag and digest is unique, and each piece can be checked on its own.

// Messages as distribution/reference and go-digest word them.
var (
	errReferenceInvalidFormat = errors.New("invalid reference format")
	errNameContainsUppercase  = errors.New("repository name must be lowercase")
	errNameEmpty              = errors.New("repository name must have at least one component")
	errNameTooLong            = fmt.Errorf("repository name must not be more than %v characters", nameTotalLengthMax)
	errDigestInvalidFormat    = errors.New("invalid checksum digest format")
	errDigestInvalidLength    = errors.New("invalid checksum digest length")
	errDigestUnsupported      = errors.New("unsupported digest algorithm")
)

const (
	nameTotalLengthMax = 255
	defaultDomain      = "docker.io"
	legacyDomain       = "index.docker.io"
	officialPrefix     = "library/"
	defaultTag         = "latest"
)

// imageRef is a parsed, normalized reference. domain is empty only for the
// odd names whose first part is neither a valid domain nor treated as Docker
// Hub (e.g. "a_b.c/x"), which the library accepts the same way.
type imageRef struct {
	domain, path, tag, digest string
}

func (r imageRef) name() string {
	if r.domain == "" {
		return r.path
	}
	return r.domain + "/" + r.path
}

// String is the kubelet's form: the tag defaults to "latest" unless the
// reference is pinned by digest.
func (r imageRef) String() string {
	s := r.name()
	tag := r.tag
	if tag == "" && r.digest == "" {
		tag = defaultTag
	}
	if tag != "" {
		s += ":" + tag
	}
	if r.digest != "" {
		s += "@" + r.digest
	}
	return s
}

// parseNormalized is ParseNormalizedNamed: Docker Hub short names get
// "docker.io/" and, for one-part paths, "library/".
func parseNormalized(s string) (imageRef, error) {
	if isHexLower(s, 64) {
		return imageRef{}, fmt.Errorf("invalid repository name (%s), cannot specify 64-byte hexadecimal strings", s)
	}
	domain, remainder := splitDockerDomain(s)
	remote := remainder
	if i := strings.IndexByte(remainder, ':'); i >= 0 {
		remote = remainder[:i]
	}
	// strings.ToLower, not an ASCII check: the library also rejects what
	// Unicode lowercasing (or invalid UTF-8) changes, with this message.
	if strings.ToLower(remote) != remote {
		return imageRef{}, fmt.Errorf("invalid reference format: repository name (%s) must be lowercase", remote)
	}
	return parseReference(domain + "/" + remainder)
}

func splitDockerDomain(s string) (domain, remainder string) {
	maybeDomain, rest, ok := strings.Cut(s, "/")
	if !ok {
		return defaultDomain, officialPrefix + s
	}
	switch {
	case maybeDomain == legacyDomain:
		domain, remainder = defaultDomain, rest
	case maybeDomain == "localhost",
		strings.ContainsAny(maybeDomain, ".:"),
		strings.ToLower(maybeDomain) != maybeDomain:
		domain, remainder = maybeDomain, rest
	default:
		domain, remainder = defaultDomain, s
	}
	if domain == defaultDomain && !strings.Contains(remainder, "/") {
		remainder = officialPrefix + remainder
	}
	return domain, remainder
}

// parseReference is the library's Parse, for input that always holds a '/'.
func parseReference(s string) (imageRef, error) {
	name, tag, digest, ok := splitReference(s)
	if !ok {
		if s == "" {
			return imageRef{}, errNameEmpty
		}
		if _, _, _, ok := splitReference(strings.ToLower(s)); ok {
			return imageRef{}, errNameContainsUppercase
		}
		return imageRef{}, errReferenceInvalidFormat
	}
	r := imageRef{tag: tag, digest: digest}
	r.domain, r.path, _ = splitName(name)
	if len(r.path) > nameTotalLengthMax {
		return imageRef{}, errNameTooLong
	}
	if digest != "" {
		if err := validateDigest(digest); err != nil {
			return imageRef{}, err
		}
	}
	return r, nil
}

// splitReference matches the whole reference grammar and returns its parts.
func splitReference(s string) (name, tag, digest string, ok bool) {
	rest := s
	if at := strings.IndexByte(s, '@'); at >= 0 {
		rest, digest = s[:at], s[at+1:]
		if !isDigest(digest) {
			return "", "", "", false
		}
	}
	name = rest
	// A tag can only follow the last '/': before it, ':' belongs to the domain.
	slash := strings.LastIndexByte(rest, '/')
	if c := strings.IndexByte(rest[slash+1:], ':'); c >= 0 {
		name, tag = rest[:slash+1+c], rest[slash+1+c+1:]
		if !isTag(tag) {
			return "", "", "", false
		}
	}
	if _, _, ok := splitName(name); !ok {
		return "", "", "", false
	}
	return name, tag, digest, true
}

// splitName prefers reading the first part as a domain, like the library's
// greedy optional group, and falls back to a path without domain.
func splitName(name string) (domain, path string, ok bool) {
	if i := strings.IndexByte(name, '/'); i >= 0 && isDomain(name[:i]) && isPath(name[i+1:]) {
		return name[:i], name[i+1:], true
	}
	if isPath(name) {
		return "", name, true
	}
	return "", "", false
}

func isDomain(d string) bool {
	host, port, hasPort := d, "", false
	if strings.HasPrefix(d, "[") {
		end := strings.IndexByte(d, ']')
		if end < 2 {
			return false
		}
		for i := 1; i < end; i++ {
			if c := d[i]; !isHexDigit(c) && c != ':' {
				return false
			}
		}
		if rest := d[end+1:]; rest != "" {
			if rest[0] != ':' {
				return false
			}
			port, hasPort = rest[1:], true
		}
	} else {
		if i := strings.IndexByte(d, ':'); i >= 0 {
			host, port, hasPort = d[:i], d[i+1:], true
		}
		if !isDomainName(host) {
			return false
		}
	}
	if hasPort {
		if port == "" {
			return false
		}
		for i := 0; i < len(port); i++ {
			if !isDigit(port[i]) {
				return false
			}
		}
	}
	return true
}

func isDomainName(h string) bool {
	for {
		label, rest, more := strings.Cut(h, ".")
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !isAlnum(c) && c != '-' {
				return false
			}
		}
		if !more {
			return true
		}
		h = rest
	}
}

func isPath(p string) bool {
	for {
		comp, rest, more := strings.Cut(p, "/")
		if !isPathComponent(comp) {
			return false
		}
		if !more {
			return true
		}
		p = rest
	}
}

func isPathComponent(c string) bool {
	if c == "" || !isLowerAlnum(c[0]) || !isLowerAlnum(c[len(c)-1]) {
		return false
	}
	for i := 0; i < len(c); {
		if isLowerAlnum(c[i]) {
			i++
			continue
		}
		j := i
		for j < len(c) && !isLowerAlnum(c[j]) {
			j++
		}
		switch sep := c[i:j]; {
		case sep == ".", sep == "_", sep == "__", strings.Trim(sep, "-") == "":
		default:
			return false
		}
		i = j
	}
	return true
}

func isTag(t string) bool {
	if t == "" || len(t) > 128 || !isWord(t[0]) {
		return false
	}
	for i := 1; i < len(t); i++ {
		if c := t[i]; !isWord(c) && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// isDigest is the reference grammar's digest: algorithm ":" 32 or more hex
// digits of either case. Whether the algorithm is known is checked later.
func isDigest(d string) bool {
	alg, enc, ok := strings.Cut(d, ":")
	if !ok || len(enc) < 32 {
		return false
	}
	for i := 0; i < len(enc); i++ {
		if !isHexDigit(enc[i]) {
			return false
		}
	}
	// Components start with a letter and are joined by one of -_+.
	start := true
	for i := 0; i < len(alg); i++ {
		c := alg[i]
		switch {
		case start:
			if !isLetter(c) {
				return false
			}
			start = false
		case c == '-' || c == '_' || c == '+' || c == '.':
			start = true
		case !isLetter(c) && !isDigit(c):
			return false
		}
	}
	return !start
}

// validateDigest is go-digest's Digest.Validate for a string that already
// passed isDigest.
func validateDigest(d string) error {
	alg, enc, _ := strings.Cut(d, ":")
	var size int
	switch alg {
	case "sha256":
		size = 32
	case "sha384":
		size = 48
	case "sha512":
		size = 64
	default:
		// go-digest wants a lowercase algorithm before it calls one unknown.
		if strings.ToLower(alg) != alg {
			return errDigestInvalidFormat
		}
		return errDigestUnsupported
	}
	if len(enc) != 2*size {
		return errDigestInvalidLength
	}
	if !isHexLower(enc, len(enc)) {
		return errDigestInvalidFormat
	}
	return nil
}

func isHexLower(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isDigit(c) && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool      { return '0' <= c && c <= '9' }
func isLetter(c byte) bool     { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isAlnum(c byte) bool      { return isLetter(c) || isDigit(c) }
func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || isDigit(c) }
func isWord(c byte) bool       { return isAlnum(c) || c == '_' }
func isHexDigit(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
