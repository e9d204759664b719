// Package creds finds registry credentials for an image the way the kubelet
// does: docker config files (.dockerconfigjson and legacy .dockercfg) and
// kubelet credential-provider exec plugins.
package creds

import (
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
)

// defaultRegistryHost is the key Docker Hub credentials are stored under.
const defaultRegistryHost = "index.docker.io"

// normalizeKey turns a docker config key ("https://index.docker.io/v1/",
// "*.example.com", "reg:5000/team") into the schemeless host[/path] form
// used for matching.
func normalizeKey(key string) (string, bool) {
	value := key
	if !strings.HasPrefix(value, "https://") && !strings.HasPrefix(value, "http://") {
		value = "https://" + value
	}
	u, err := url.Parse(value)
	if err != nil || u.Host == "" {
		return "", false
	}
	p := u.Path
	// Registry API version prefixes are not part of a repository path.
	if strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/v2/") {
		p = p[3:]
	}
	if p != "" && p != "/" {
		return u.Host + p, true
	}
	return u.Host, true
}

func parseSchemeless(s string) (*url.URL, error) {
	u, err := url.Parse("https://" + s)
	if err != nil {
		return nil, err
	}
	u.Scheme = ""
	return u, nil
}

func splitHost(u *url.URL) ([]string, string) {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, ""
	}
	return strings.Split(host, "."), port
}

// URLsMatch reports whether the schemeless pattern (a config key or a
// matchImages entry) matches the schemeless image. Host labels are matched
// one by one with glob rules, so "*.example.com" matches "a.example.com"
// but not "example.com" or "a.b.example.com"; ports must be equal; the
// pattern's path must be a prefix of the image's path.
func URLsMatch(pattern, image string) bool {
	pu, err := parseSchemeless(pattern)
	if err != nil {
		return false
	}
	iu, err := parseSchemeless(image)
	if err != nil {
		return false
	}
	pParts, pPort := splitHost(pu)
	iParts, iPort := splitHost(iu)
	if pPort != iPort || len(pParts) != len(iParts) {
		return false
	}
	if !strings.HasPrefix(iu.Path, pu.Path) {
		return false
	}
	for i, part := range pParts {
		if ok, err := filepath.Match(part, iParts[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

// isDefaultRegistry reports whether image lives on Docker Hub.
func isDefaultRegistry(image string) bool {
	first, _, found := strings.Cut(image, "/")
	if first == "" {
		return false
	}
	if !found {
		return true
	}
	if first == "docker.io" || first == "index.docker.io" {
		return true
	}
	return !strings.ContainsAny(first, ".:")
}

// Keyring holds credentials indexed by normalized key.
type Keyring struct {
	creds map[string][]Credential
	index []string
}

// Add adds one credential under a docker config key.
func (k *Keyring) Add(key string, c Credential) {
	nk, ok := normalizeKey(key)
	if !ok {
		return
	}
	if k.creds == nil {
		k.creds = map[string][]Credential{}
	}
	if _, seen := k.creds[nk]; !seen {
		k.index = append(k.index, nk)
		// Reverse order puts longer, more specific keys with the same
		// prefix first, as the kubelet does.
		sort.Sort(sort.Reverse(sort.StringSlice(k.index)))
	}
	k.creds[nk] = append(k.creds[nk], c)
}

// Lookup returns every credential whose key matches image (a normalized
// reference; tag and digest are ignored), most specific first.
func (k *Keyring) Lookup(image string) []Credential {
	repo := stripTagDigest(image)
	var out []Credential
	for _, key := range k.index {
		if URLsMatch(key, repo) {
			out = append(out, k.creds[key]...)
		}
	}
	if len(out) > 0 {
		return out
	}
	if isDefaultRegistry(repo) {
		for _, key := range []string{defaultRegistryHost, "docker.io", "registry-1.docker.io"} {
			out = append(out, k.creds[key]...)
		}
	}
	return out
}

// stripTagDigest removes ":tag" and "@digest" from a reference, leaving a
// possible ":port" in the host alone.
func stripTagDigest(ref string) string {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	slash := strings.LastIndexByte(ref, '/')
	if c := strings.LastIndexByte(ref, ':'); c > slash {
		ref = ref[:c]
	}
	return ref
}
