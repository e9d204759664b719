package scale

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Node heartbeats. Every node of a cluster has a Lease in kube-node-lease
// that its kubelet renews every 10 s (a quarter of the 40 s
// nodeLeaseDurationSeconds). The apiserver keeps one watch cache for all
// Leases, and sizes each new Lease watch's buffer from that cache's event
// rate: capacity ÷ 75 s, at least 10 and at most 100 events
// (k8s.io/apiserver storage/cacher, suggestedWatchChannelSize). Without
// heartbeats the cache holds only the slot Leases, every waiter's watch
// gets the smallest buffer, and a burst of slot changes closes thousands
// of them (2,784 in one 1,000-node run at K = 50; 271 in one with
// heartbeats).
const (
	nodeLeaseNamespace = "kube-node-lease"
	heartbeatEvery     = 10 * time.Second
	nodeLeaseSeconds   = 40
)

// heartbeats renews a node Lease for each node, as its kubelet would,
// until ctx ends. Each node has its own loop at a random phase, so the
// apiserver sees len(nodes) ÷ 10 s renewals a second whatever their
// latency. The counts let the report tell these requests from the
// agents': beats is the renewals made, others the heartbeat requests the
// apiserver answered otherwise (a refused renewal, and the read after
// it), which it would count among the waiters' requests.
type heartbeats struct {
	beats, others atomic.Int64
}

func (hb *heartbeats) start(ctx context.Context, cfg *rest.Config, nodes []string) error {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0 // every kubelet has a client of its own
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("node heartbeats: %w", err)
	}
	leases := cs.CoordinationV1().Leases(nodeLeaseNamespace)
	for _, n := range nodes {
		lease, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n), LeaseDurationSeconds: ptr.To(int32(nodeLeaseSeconds)),
				RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create node Lease %s: %w", n, err)
		}
		go func() {
			if !sleepUntil(ctx, time.Now().Add(mrand.N(heartbeatEvery))) {
				return
			}
			t := time.NewTicker(heartbeatEvery)
			defer t.Stop()
			for {
				lease = hb.renew(ctx, leases, lease)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	return nil
}

// renew writes a new renewTime on the version last seen (Leases take no
// unconditional update); after a failure it reads the Lease again, so
// that a write whose answer was lost does not conflict for good.
func (hb *heartbeats) renew(ctx context.Context, leases coordinationclient.LeaseInterface, cur *coordinationv1.Lease) *coordinationv1.Lease {
	next := cur.DeepCopy()
	next.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	l, err := leases.Update(ctx, next, metav1.UpdateOptions{})
	if err == nil {
		hb.beats.Add(1)
		return l
	}
	hb.answered(err)
	l, err = leases.Get(ctx, cur.Name, metav1.GetOptions{})
	hb.answered(err)
	if err != nil {
		return cur
	}
	return l
}

// answered counts a heartbeat request the apiserver answered with a
// status other than a successful write (nil: a read that succeeded).
func (hb *heartbeats) answered(err error) {
	var status apierrors.APIStatus
	if err == nil || errors.As(err, &status) {
		hb.others.Add(1)
	}
}
