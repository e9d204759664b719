package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// TestFetchNodeAndInstanceFromEnv: --node-name, --instance and --namespace
// default to NODE_NAME, INSTANCE_NAME and POD_NAMESPACE, which the
// DaemonSet sets; a flag wins over its variable. The environment is the process's own (t.Setenv, and no
// Getenv seam), as in production.
func TestFetchNodeAndInstanceFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"from the environment", map[string]string{"NODE_NAME": testNode, "INSTANCE_NAME": testInstance, "POD_NAMESPACE": testNamespace}, nil},
		{"flags win", map[string]string{"NODE_NAME": "node-b", "INSTANCE_NAME": "other", "POD_NAMESPACE": "elsewhere"}, []string{"--node-name=" + testNode, "--instance=" + testInstance, "--namespace=" + testNamespace}},
		{"one of each", map[string]string{"NODE_NAME": testNode, "INSTANCE_NAME": "other", "POD_NAMESPACE": testNamespace}, []string{"--instance=" + testInstance}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			// Outside a pod whatever the machine running the tests says.
			for _, k := range []string{"NODE_NAME", "INSTANCE_NAME", "POD_NAME", "POD_NAMESPACE"} {
				t.Setenv(k, tt.env[k])
			}
			deps := e.deps()
			deps.Getenv = nil
			args := append([]string{"fetch", "--cri-socket=" + e.cri.Socket, "x:1"}, tt.args...)
			if code := Execute(context.Background(), args, deps); code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			v, s, ok := e.state()
			if !ok || v != "succeeded" || s.Present != 1 {
				t.Errorf("%s on %s: label %q, summary %+v", testKey, testNode, v, s)
			}
			if s.Owner == nil || s.Owner.Namespace != testNamespace || s.Owner.Name != testInstance {
				t.Errorf("owner %+v, want %s/%s", s.Owner, testNamespace, testInstance)
			}
			if strings.Contains(e.logs.String(), "not labeling the node") {
				t.Errorf("labeling skipped:\n%s", e.logs)
			}
			// Nothing under the variables' names when a flag won: node-b
			// and the key of instance "other" are untouched.
			e.assertOthersUntouched()
		})
	}
}

// TestFetchLabelDomain: --label-domain changes the prefix of the label and
// annotation key, and nothing is written under the default one.
func TestFetchLabelDomain(t *testing.T) {
	e := newEnv(t)
	const key = "prefetch.example.com/" + testInstance
	if code := e.run(e.agentArgs("fetch", "--label-domain=prefetch.example.com", "x:1")...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	n := e.node(testNode)
	if v := n.Labels[key]; v != "succeeded" {
		t.Errorf("label %s = %q, want succeeded; labels %v", key, v, n.Labels)
	}
	s, err := label.Parse(n.Annotations[key])
	if err != nil || s.Total != 1 || s.Present != 1 {
		t.Errorf("annotation %s = %q (%v)", key, n.Annotations[key], err)
	}
	if _, has := n.Labels[testKey]; has {
		t.Errorf("labeled under the default domain too: %v", n.Labels)
	}
	if _, has := n.Annotations[testKey]; has {
		t.Errorf("annotated under the default domain too: %v", n.Annotations)
	}
	e.assertOthersUntouched()
}

// TestFetchParallelism: --parallelism bounds the PullImage calls the
// runtime works on at once, and the bound is reached. Each call is held
// until the test lets one go, which it does only once the previous release
// has let the next call in: so the runtime sees the bound, and a call
// beyond it could only come from the agent. 6 is above the default of 4,
// so a flag that does not reach the puller fails for sure.
func TestFetchParallelism(t *testing.T) {
	for _, parallelism := range []int{2, 6} {
		t.Run(fmt.Sprint(parallelism), func(t *testing.T) {
			e := newEnv(t)
			var images []string
			arrived := make(chan string, 64)
			release := make(chan struct{})
			for i := range 7 {
				ref := fmt.Sprintf("quay.io/org/app-%d:1", i)
				images = append(images, ref)
				e.cri.SetBehavior(ref, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
					arrived <- ref
					select {
					case <-release:
						return nil
					case <-ctx.Done():
						return status.FromContextError(ctx.Err()).Err()
					}
				})
			}
			// The attempt timeout is what ends a held call if the agent
			// never reaches the bound; the test then fails instead of
			// hanging.
			args := e.agentArgs("fetch", append([]string{fmt.Sprintf("--parallelism=%d", parallelism), "--initial-pull-attempt-timeout=1m"}, images...)...)
			done := make(chan int, 1)
			go func() { done <- Execute(context.Background(), args, e.deps()) }()
			code, finished := 0, false
			// next waits for a call to arrive, or for the run to end.
			next := func() {
				if finished {
					return
				}
				select {
				case <-arrived:
				case code = <-done:
					finished = true
				}
			}
			for range parallelism {
				next()
			}
			// A bound that does not hold shows as calls beyond it right
			// after the first ones, but the test would let one go before
			// they arrive. The pause only gives them time to: the test
			// never fails for want of time, since the agent must send no
			// such call however long it waits.
			time.Sleep(100 * time.Millisecond)
			for i := parallelism; i < len(images) && !finished; i++ {
				select {
				case release <- struct{}{}:
				case code = <-done:
					finished = true
				}
				next()
			}
			// The last calls go without waiting for more.
			for !finished {
				select {
				case release <- struct{}{}:
				case code = <-done:
					finished = true
				}
			}
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			if got := e.cri.MaxConcurrentPulls(); got != parallelism {
				t.Errorf("at most %d pulls at once, want %d", got, parallelism)
			}
			if n := len(e.cri.Pulls("")); n != len(images) {
				t.Errorf("%d PullImage calls, want %d (one per image)", n, len(images))
			}
			if v, s, _ := e.state(); v != "succeeded" || s.Present != len(images) {
				t.Errorf("label %q summary %+v", v, s)
			}
		})
	}
}
