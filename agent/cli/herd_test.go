package cli

import (
	"context"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// lossyGate hands out slots the test can take away.
type lossyGate struct{ holds chan *lossySlot }

type lossySlot struct {
	lost     chan struct{}
	released chan struct{}
	once     sync.Once
}

func (s *lossySlot) Release()              { s.once.Do(func() { close(s.released) }) }
func (s *lossySlot) Lost() <-chan struct{} { return s.lost }

func (g *lossyGate) Hold(context.Context) (pull.Slot, error) {
	s := &lossySlot{lost: make(chan struct{}), released: make(chan struct{})}
	g.holds <- s
	return s, nil
}

// Issue 26 item 5: with metrics on, a node whose slot is lost stops
// pulling, as with metrics off.
func TestLostSlotStopsThePullWithMetricsOn(t *testing.T) {
	for _, metricsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "metrics off", true: "metrics on"}[metricsOn], func(t *testing.T) {
			e := newEnv(t)
			gate := &lossyGate{holds: make(chan *lossySlot, 2)}
			deps := e.deps()
			deps.NewGate = func(context.Context, GateConfig) (pull.Gate, error) { return gate, nil }
			ref := "quay.io/org/big:1"
			arrived, cancelled := make(chan struct{}, 1), make(chan struct{}, 1)
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) })
			e.cri.SetBehavior(ref, func(ctx context.Context, n int, _ *runtimeapi.PullImageRequest) error {
				if n > 1 {
					return nil
				}
				arrived <- struct{}{}
				select {
				case <-ctx.Done():
					cancelled <- struct{}{}
					return ctx.Err()
				case <-stop:
					return nil
				}
			})
			args := []string{"--max-concurrent-nodes=1", "--initial-pull-attempt-timeout=10m", ref}
			if metricsOn {
				args = append([]string{"--metrics-addr=127.0.0.1:0"}, args...)
			}
			done := make(chan int, 1)
			go func() { done <- Execute(context.Background(), e.agentArgs("fetch", args...), deps) }()
			first := <-gate.holds
			<-arrived
			close(first.lost)
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatalf("the slot was lost 10s ago and the pull goes on")
			}
			second := <-gate.holds
			if code := <-done; code != 0 {
				t.Fatalf("exit %d:\n%s", code, e.logs)
			}
			select {
			case <-first.released:
			default:
				t.Error("the lost slot was not released")
			}
			<-second.released
		})
	}
}

// hungRelease is a kube.Interface whose Lease updates that clear the
// holder (a release) hang until their context ends, as against an API
// server that accepts connections and never answers.
type hungRelease struct{ kube.Interface }

func (h hungRelease) Leases(ns string) kube.LeaseClient { return hungLeases{h.Interface.Leases(ns)} }

type hungLeases struct{ kube.LeaseClient }

func (l hungLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if lease.Spec.HolderIdentity == nil {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.LeaseClient.Update(ctx, lease, opts)
}

// Issue 26 item 5: fetch, terminated while it pulls, gives its slot back
// within the documented grace of 5 s, with metrics on as with metrics
// off: against a hung API server it waits for the release that long, and
// no longer.
func TestFetchReleaseGraceWithMetrics(t *testing.T) {
	for _, metricsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "metrics off", true: "metrics on"}[metricsOn], func(t *testing.T) {
			t.Parallel()
			const ns, pod = "prefetch", "prefetch-abc"
			e := newEnv(t)
			enforceLeaseVersions(e.kube)
			e.getenv["POD_NAME"], e.getenv["POD_NAMESPACE"] = pod, ns
			deps := e.deps()
			deps.Kube = func(string) (kube.Interface, error) { return hungRelease{clientset.Wrap(e.kube)}, nil }
			ref := "quay.io/org/big:1"
			arrived := make(chan struct{}, 1)
			e.cri.SetBehavior(ref, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
				arrived <- struct{}{}
				return fakecri.Stall(ctx)
			})
			args := []string{"--max-concurrent-nodes=1", "--initial-pull-attempt-timeout=10m", ref}
			if metricsOn {
				args = append([]string{"--metrics-addr=127.0.0.1:0"}, args...)
			}
			// Cancelled as SIGTERM cancels it; a signal would end the
			// other subtest's run too.
			ctx, terminate := context.WithCancel(context.Background())
			defer terminate()
			done := make(chan int, 1)
			go func() { done <- Execute(ctx, e.agentArgs("fetch", args...), deps) }()
			<-arrived
			sent := time.Now()
			terminate()
			if code := <-done; code != ExitError {
				t.Errorf("exit %d, want %d (did not finish)", code, ExitError)
			}
			if took := time.Since(sent); took < fetchReleaseGrace {
				t.Errorf("fetch gave up releasing its slot %v after it was terminated, before the documented grace of %v", took.Round(time.Millisecond), fetchReleaseGrace)
			}
		})
	}
}

// ownedPod is a pod the DaemonSet controller made for ds.
func ownedPod(ns, name string, ds *appsv1.DaemonSet) *corev1.Pod {
	yes := true
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes,
	}}}}
}
