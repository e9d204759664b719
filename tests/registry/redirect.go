package registry

import (
	"net/http"
	"sync"
)

type redirectRule struct {
	match    Match
	location string
	n        int
	seen     map[string]int
}

// RedirectBlobs answers the first n GETs of each blob that m matches (Kind
// is forced to Blobs; n <= 0: every GET) with a 307 to location followed by
// the request path, as a registry does that serves blobs from an object
// store through presigned URLs. Later GETs are served as usual.
func (r *Registry) RedirectBlobs(m Match, location string, n int) {
	m.Kind = Blobs
	r.mu.Lock()
	defer r.mu.Unlock()
	r.redirects = append(r.redirects, &redirectRule{match: m, location: location, n: n, seen: map[string]int{}})
}

// redirect returns where to send a blob GET, or "".
func (r *Registry) redirect(rt route, req *http.Request) string {
	if req.Method != http.MethodGet || rt.kind != Blobs {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.redirects {
		if d.match.matches(rt, req.Method) {
			key := rt.repo + "@" + rt.ref
			d.seen[key]++
			if d.n <= 0 || d.seen[key] <= d.n {
				return d.location + req.URL.Path
			}
		}
	}
	return ""
}

// ExpiredObjectStore is the object store behind a redirecting registry
// when its presigned URLs have expired, or were signed by a clock that is
// off: every request gets S3's 403 AccessDenied. It counts its requests.
type ExpiredObjectStore struct {
	mu       sync.Mutex
	requests int
}

// Requests is how many requests the store answered.
func (s *ExpiredObjectStore) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

func (s *ExpiredObjectStore) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
		`<Error><Code>AccessDenied</Code><Message>Request has expired</Message><X-Amz-Expires>600</X-Amz-Expires></Error>`))
}

// Stalled is how many GETs the stall rule added with exactly m have held
// so far (held now or released), so that a test can act while a pull is
// mid-way: a held request is only in Requests once it ends.
func (r *Registry) Stalled(m Match) int {
	m.Kind = Blobs
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	for _, s := range r.stalls {
		if s.match != m {
			continue
		}
		for _, seen := range s.seen {
			if s.n > 0 {
				seen = min(seen, s.n)
			}
			total += seen
		}
	}
	return total
}

// challengeBase answers the API base (/v2/) the way a registry with
// protected repositories does: 401 with a Basic challenge to a client that
// sent no credentials. Clients that ping first, as CRI-O's containers/image
// does, learn there that they may send credentials, and send them only then;
// anonymous clients go on to public repositories as before. It reports
// whether it answered.
func (r *Registry) challengeBase(w http.ResponseWriter, req *http.Request) bool {
	if req.URL.Path != "/v2/" {
		return false
	}
	r.mu.Lock()
	protected := len(r.auth) > 0
	r.mu.Unlock()
	if !protected || req.Header.Get("Authorization") != "" {
		return false
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="image-prefetcher-e2e"`)
	writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
	return true
}
