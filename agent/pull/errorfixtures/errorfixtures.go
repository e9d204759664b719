// Package errorfixtures reads and writes the pull errors recorded from real
// container runtimes (agent/pull/testdata/errors/<runtime>/<kind>.json).
// tests/runtimes records them with -update; the classifier's tests and the
// table in docs/agent.md are derived from them.
package errorfixtures

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kinds of error, one fixture file each per runtime that has it.
const (
	NotFoundTag                  = "not-found-tag"
	NotFoundRepo                 = "not-found-repo"
	UnauthorizedAnonymous        = "unauthorized-anonymous"
	UnauthorizedWrongCredentials = "unauthorized-wrong-credentials"
	Forbidden                    = "forbidden"
	RateLimited                  = "rate-limited"
	Unavailable                  = "unavailable"
	RegistryDown                 = "registry-down"
	InvalidReference             = "invalid-reference"
	PlatformMismatch             = "platform-mismatch"
	StalledBlob                  = "stalled-blob"
	BlobRedirectForbidden        = "blob-redirect-forbidden"
	Schema1                      = "schema-1"
	VerifierRejected             = "verifier-rejected"
	ShortNameUnresolved          = "short-name-unresolved"
	DiskFull                     = "disk-full"
)

// Kinds lists every kind in the order of the docs table.
var Kinds = []string{
	NotFoundTag, NotFoundRepo, UnauthorizedAnonymous, UnauthorizedWrongCredentials, Forbidden,
	PlatformMismatch, Schema1, VerifierRejected, ShortNameUnresolved, InvalidReference,
	RateLimited, Unavailable, RegistryDown, StalledBlob, BlobRedirectForbidden, DiskFull,
}

// Fixture is one error a runtime returned from PullImage.
type Fixture struct {
	Runtime   string `json:"runtime"`
	Version   string `json:"version"`
	Kind      string `json:"kind"`
	Reference string `json:"reference"`
	// Code is the gRPC code's name; OK when the runtime pulled the image.
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// Err is the error as the agent's CRI client receives it; nil for OK.
func (f Fixture) Err() error {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == f.Code {
			if c == codes.OK {
				return nil
			}
			return status.Error(c, f.Message)
		}
	}
	return fmt.Errorf("fixture %s/%s: unknown gRPC code %q", f.Runtime, f.Kind, f.Code)
}

// Path is the file of one runtime's fixture of kind under dir.
func Path(dir, runtime, kind string) string {
	return filepath.Join(dir, runtime, kind+".json")
}

// Write stores f at path.
func Write(path string, f Fixture) error {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode fixture: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create fixture dir: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write fixture: %w", err)
	}
	return nil
}

// Read loads the fixture at path.
func Read(path string) (Fixture, error) {
	var f Fixture
	data, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("read fixture: %w", err)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return f, fmt.Errorf("decode fixture %s: %w", path, err)
	}
	return f, nil
}

// ReadAll loads every fixture under dir, by runtime then kind.
func ReadAll(dir string) ([]Fixture, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*", "*.json"))
	if err != nil {
		return nil, fmt.Errorf("list fixtures: %w", err)
	}
	sort.Strings(paths)
	var out []Fixture
	for _, p := range paths {
		f, err := Read(p)
		if err != nil {
			return nil, err
		}
		if want := strings.TrimSuffix(filepath.Base(p), ".json"); f.Kind != want {
			return nil, fmt.Errorf("fixture %s says kind %q", p, f.Kind)
		}
		out = append(out, f)
	}
	return out, nil
}
