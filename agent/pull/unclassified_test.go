package pull

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// failingRuntime fails every pull of an image with its error.
type failingRuntime struct {
	mu    sync.Mutex
	errs  map[string]error
	pulls map[string]int
}

func (f *failingRuntime) ImageStatus(context.Context, string) (*cri.ImageInfo, error) {
	return nil, nil
}

func (f *failingRuntime) PullImage(_ context.Context, ref string, _ *cri.Auth) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ref = containerdRef(ref)
	f.pulls[ref]++
	return "", f.errs[ref]
}

type unclassifiedCounter struct {
	nopObserver
	mu sync.Mutex
	n  int
}

func (c *unclassifiedCounter) Unclassified() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func TestUnclassifiedErrorsAreRetriedLoggedOnceAndCounted(t *testing.T) {
	const odd = "failed to extract layer sha256:abc: something no runtime said before"
	rt := &failingRuntime{
		errs: map[string]error{
			"docker.io/library/odd:1":  errors.New(odd),
			"docker.io/library/typo:1": errors.New(`reading manifest 1 in docker.io/library/typo: manifest unknown: Unknown manifest`),
		},
		pulls: map[string]int{},
	}
	var logs bytes.Buffer
	obs := &unclassifiedCounter{}
	p := New(rt, Config{
		Creds: noCreds{}, Observer: obs,
		Log:            slog.New(slog.NewTextHandler(&logs, nil)),
		OverallTimeout: time.Hour,
		// The run ends once the unclassified image has had five attempts
		// and the classified one has given up. The two retry side by side,
		// so the unclassified one may have had a few more by then.
		Sleep: func(ctx context.Context, _ time.Duration) error {
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if rt.pulls["docker.io/library/odd:1"] >= 5 && rt.pulls["docker.io/library/typo:1"] >= 3 {
				return context.Canceled
			}
			return nil
		},
	})
	res := p.Run(context.Background(), entries("odd:1", "typo:1"), "")
	odds := rt.pulls["docker.io/library/odd:1"]
	if odds < 5 {
		t.Errorf("unclassified error pulled %d times, want at least 5: it must be retried as transient, past the 3 attempts of a permanent error", odds)
	}
	if res[1].Reason != ReasonNotFound || res[1].Attempts != 3 {
		t.Errorf("classified error: %+v, want NotFound after 3 attempts", res[1])
	}
	if obs.n != odds {
		t.Errorf("unclassified counted %d times, want once per attempt (%d)", obs.n, odds)
	}
	lines := strings.Count(logs.String(), "class=unclassified")
	if lines != 1 {
		t.Errorf("unclassified logged %d times, want once:\n%s", lines, logs.String())
	}
	if !strings.Contains(logs.String(), odd) {
		t.Errorf("the log lacks the full text %q:\n%s", odd, logs.String())
	}
}
