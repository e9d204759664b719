package hits

import (
	"strings"

	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// matcher tells whether an image named in a kubelet Event is one of the
// list's. Both are normalized as the kubelet and the agent do ("app" is
// docker.io/library/app:latest). Then the repository must be the same,
// and: the digest when both have one, otherwise the tag. A pod that names
// an image by digest alone therefore matches only an entry of that digest.
type matcher map[string][]ref // by repository

type ref struct{ tag, digest string }

func newMatcher(l imagelist.List) matcher {
	m := matcher{}
	for _, e := range l.Entries {
		if e.Err != nil {
			continue
		}
		name, r := split(e.Normalized)
		m[name] = append(m[name], r)
	}
	return m
}

func (m matcher) matches(image string) bool {
	n, err := imagelist.Normalize(image)
	if err != nil {
		return false
	}
	name, r := split(n)
	for _, e := range m[name] {
		if e.digest != "" && r.digest != "" {
			if e.digest == r.digest {
				return true
			}
			continue
		}
		if e.tag != "" && e.tag == r.tag {
			return true
		}
	}
	return false
}

// split cuts a normalized reference, repository[:tag][@digest], into its
// parts. A ':' before the last '/' belongs to the registry's port.
func split(normalized string) (string, ref) {
	var r ref
	rest := normalized
	if at := strings.IndexByte(rest, '@'); at >= 0 {
		rest, r.digest = rest[:at], rest[at+1:]
	}
	if c := strings.LastIndexByte(rest, ':'); c > strings.LastIndexByte(rest, '/') {
		rest, r.tag = rest[:c], rest[c+1:]
	}
	return rest, r
}
