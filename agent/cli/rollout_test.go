package cli

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A rollout with a changed list: the node already carries the key from
// the previous pods. Until the new images are there, the label says failed
// with them as Missing; then succeeded. On a node without the key, nothing
// is written before the pull ends.
func TestFetchLabelWhileAChangedListIsPulled(t *testing.T) {
	for _, labeled := range []bool{true, false} {
		t.Run(map[bool]string{true: "key kept from the previous pods", false: "first install"}[labeled], func(t *testing.T) {
			e := newEnv(t)
			e.cri.AddImage("docker.io/library/old:1", 1)
			if labeled {
				if code := e.run(e.agentArgs("fetch", "old:1")...); code != 0 {
					t.Fatalf("exit %d", code)
				}
			}
			ref := "docker.io/library/new:1"
			pulling := make(chan struct{})
			release := make(chan struct{})
			e.cri.SetBehavior(ref, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
				close(pulling)
				<-release
				return nil
			})
			done := make(chan int, 1)
			go func() { done <- e.run(e.agentArgs("fetch", "old:1", "new:1")...) }()
			<-pulling
			v, s, ok := e.state()
			if labeled {
				if v != "failed" || s.Present != 1 || len(s.Failed) != 1 || s.Failed[0].Image != "new:1" || s.Failed[0].Reason != "Missing" {
					t.Errorf("while pulling: label %q summary %+v, want failed with new:1 Missing", v, s)
				}
			} else if ok || v != "" {
				t.Errorf("while pulling on a new node: label %q, want none yet", v)
			}
			close(release)
			if code := <-done; code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			if v, s, _ := e.state(); v != "succeeded" || s.Present != 2 {
				t.Errorf("after: label %q summary %+v", v, s)
			}
			e.assertOthersUntouched()
		})
	}
}
