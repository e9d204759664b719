package pull

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// rawRuntime records the references exactly as the agent sent them.
type rawRuntime struct {
	mu               sync.Mutex
	statuses, pulled []string
}

func (r *rawRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = append(r.statuses, ref)
	return nil, nil
}

func (r *rawRuntime) PullImage(_ context.Context, ref string, _ *cri.Auth) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pulled = append(r.pulled, ref)
	return ref, nil
}

// The runtime is asked for what the kubelet would ask for the same string
// in a pod spec, not for a form the agent qualified itself: CRI-O resolves
// "app:latest" through its aliases, and would resolve
// docker.io/library/app:latest to Docker Hub.
func TestRuntimeGetsTheKubeletReference(t *testing.T) {
	rt := &rawRuntime{}
	p := New(rt, Config{Creds: noCreds{}, Policy: "Always"})
	res := p.Run(context.Background(), entries("app", "busybox:1.36", "quay.io/team/x", "docker.io/library/app"), "")
	want := []string{"app:latest", "busybox:1.36", "quay.io/team/x:latest"}
	// "docker.io/library/app" names the same image as "app" and is
	// dropped as a duplicate by the list, which compares normalized forms.
	if len(res) != 3 {
		t.Fatalf("%d results, want 3 (the normalized duplicate dropped): %+v", len(res), res)
	}
	slices.Sort(rt.pulled)
	if !slices.Equal(rt.pulled, want) {
		t.Errorf("pulled %q, want %q", rt.pulled, want)
	}
	for _, r := range res {
		if r.Normalized == "docker.io/library/app:latest" && r.Ref != "app:latest" {
			t.Errorf("%+v: Ref is not the kubelet's", r)
		}
	}
	p = New(rt, Config{Creds: noCreds{}, Policy: "IfNotPresent"})
	rt.statuses = nil
	p.Run(context.Background(), entries("app"), "")
	if !slices.Contains(rt.statuses, "app:latest") || slices.Contains(rt.statuses, "docker.io/library/app:latest") {
		t.Errorf("ImageStatus asked for %q, want app:latest", rt.statuses)
	}
}
