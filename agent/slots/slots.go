// Package slots caps how many nodes of a cluster pull images at once. It
// hands out K slots, each a coordination.k8s.io/v1 Lease named
// <instance>-slot-<i> in the agent's namespace. Taking one is an
// optimistic write (a create, or an update carrying the resourceVersion
// last seen), so that of two racing nodes the apiserver accepts one; the
// holder renews while it pulls and clears the holder when done
// (holding.go). Others take a dead holder's slot once they have seen its
// Lease unchanged for leaseDurationSeconds on their own clock, as
// client-go's leader election does, so that clock skew cannot make a live
// holder look dead. Waiting is in wait.go.
//
// Seed mode: until a seed has finished, only slots 0..N-1 may be taken. A
// seed that finishes records it on its slot (SeededAnnotation) as it
// releases it; any waiting node may take a seed slot.
package slots

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

const (
	// DefaultLeaseDuration is client-go's leader election default.
	DefaultLeaseDuration = 15 * time.Second
	DefaultCallTimeout   = 10 * time.Second // bounds each API call
	// DefaultForbiddenFor: a restarted apiserver answers Forbidden until
	// its RBAC caches are filled, which takes seconds.
	DefaultForbiddenFor = 30 * time.Second
	// DefaultReleaseGrace bounds a release once the pod is terminating.
	DefaultReleaseGrace = 5 * time.Second

	// SeededAnnotation on a slot says that a seed has finished; its value
	// is that seed's Config.SeedKey.
	SeededAnnotation = v1alpha1.LabelDomain + "/seeded"

	// Labels on the slot Leases, for the waiters' watch and for admins.
	LabelName          = "app.kubernetes.io/name"
	LabelInstance      = "app.kubernetes.io/instance"
	LabelComponent     = "app.kubernetes.io/component"
	LabelComponentSlot = "pull-slot"
)

// LeaseClient reads and writes the slot Leases: the agent's
// kube.Client.Leases(namespace), or client-go's typed Lease client.
type LeaseClient = kube.LeaseClient

// Config says which slots to use and how.
type Config struct {
	// Client is the Lease client of Namespace, the agent's own namespace;
	// Instance names the slots: <Instance>-slot-0 .. <Instance>-slot-(K-1).
	Client              LeaseClient
	Namespace, Instance string
	// Slots is K, the number of nodes that may pull at once; SeedNodes is
	// N, how many pull until one seed has finished (0: no seed mode).
	Slots, SeedNodes int
	// SeedKey names what is being seeded, for example a digest of the image
	// list: a finished seed opens the gate only for nodes with the same key,
	// so a new list is seeded again. Empty means "any seed counts".
	SeedKey string
	// Identity names this agent in holderIdentity, usually the pod name;
	// each Hold appends a random suffix, so two holds never share a name.
	Identity string
	// LeaseDuration is written to leaseDurationSeconds, in whole seconds
	// rounded up. Default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// ReleaseGrace bounds a release once the context given to Hold has
	// ended, a release already in flight included; CallTimeout bounds each
	// API call; ForbiddenFor is how long the API may refuse every slot (or
	// the list) before the wait ends with an error. Defaults Default*.
	ReleaseGrace, CallTimeout, ForbiddenFor time.Duration
	// Logger receives progress and problems. Default slog.Default().
	Logger *slog.Logger
}

// Gate hands out slots. It is safe for concurrent use.
type Gate struct {
	cfg Config
	log *slog.Logger
	// selector picks the instance's slot Leases for the waiters' watch.
	selector string
	// The clock, the window a take's delay is drawn in and the first pause
	// after a failed call (wait.go); tests replace them.
	now           func() time.Time
	window, retry time.Duration
}

// New checks cfg and fills in defaults.
func New(cfg Config) (*Gate, error) {
	// The agent's flags are checked where they are read (agent/cli).
	switch {
	case cfg.Slots < 1:
		return nil, fmt.Errorf("slots: %d slots, need at least 1", cfg.Slots)
	case cfg.Identity == "":
		return nil, errors.New("slots: no holder identity (set POD_NAME)")
	}
	// leaseDurationSeconds is whole: rounded up, never less than asked.
	cfg.LeaseDuration = (cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration) + time.Second - 1).Truncate(time.Second)
	cfg.CallTimeout = cmp.Or(cfg.CallTimeout, DefaultCallTimeout)
	cfg.ReleaseGrace = cmp.Or(cfg.ReleaseGrace, DefaultReleaseGrace)
	cfg.ForbiddenFor = cmp.Or(cfg.ForbiddenFor, DefaultForbiddenFor)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.SeedKey = cmp.Or(cfg.SeedKey, "true")
	return &Gate{
		cfg: cfg, log: cfg.Logger.With("component", "slots"),
		selector: labels.SelectorFromSet(labels.Set{LabelInstance: cfg.Instance, LabelComponent: LabelComponentSlot}).String(),
		now:      time.Now, window: window, retry: minRetry,
	}, nil
}

// SlotName is the name of slot i of an instance.
func SlotName(instance string, i int) string {
	return fmt.Sprintf("%s-slot-%d", instance, i)
}

// Hold waits until it holds a slot, ctx ends, or the API refuses us for
// good (missing RBAC); transient errors are logged and retried. The caller
// must Release the result.
func (g *Gate) Hold(ctx context.Context) (*Holding, error) {
	start := g.now()
	h, err := g.newWaiter(ctx).wait()
	if err != nil {
		return nil, err
	}
	g.log.Info("acquired pull slot", "slot", h.Name(), "holder", h.id, "seed", h.seed,
		"waited", g.now().Sub(start).Round(time.Millisecond).String())
	return h, nil
}

func holder(lease *coordinationv1.Lease) string {
	if lease == nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// duration is a Lease's own leaseDurationSeconds: a holder configured
// differently (during a rollout) is judged by what it promised.
func (g *Gate) duration(lease *coordinationv1.Lease) time.Duration {
	if d := lease.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		return time.Duration(*d) * time.Second
	}
	return g.cfg.LeaseDuration
}

// taken is slot i's Lease with id as its new holder: prev (nil when the
// Lease is made) with our labels on it and one more transition.
func (g *Gate) taken(prev *coordinationv1.Lease, i int, id string, now time.Time) *coordinationv1.Lease {
	next := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: SlotName(g.cfg.Instance, i), Namespace: g.cfg.Namespace}}
	transitions := int32(0)
	if prev != nil {
		next = prev.DeepCopy()
		transitions = ptr.Deref(prev.Spec.LeaseTransitions, 0) + 1
	}
	secs, t := int32(g.cfg.LeaseDuration/time.Second), metav1.NewMicroTime(now)
	next.Spec = coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &t, RenewTime: &t, LeaseTransitions: &transitions}
	// The waiters' watch selects on these labels.
	next.Labels = labels.Merge(next.Labels, map[string]string{LabelName: "image-prefetcher", LabelInstance: g.cfg.Instance, LabelComponent: LabelComponentSlot})
	return next
}

// The API calls, each under its own timeout.
func (g *Gate) get(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	return g.cfg.Client.Get(ctx, name, metav1.GetOptions{})
}

func (g *Gate) create(ctx context.Context, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	return g.cfg.Client.Create(ctx, lease, metav1.CreateOptions{})
}

// update carries lease.ResourceVersion, so the apiserver rejects it with
// a conflict if anyone wrote the Lease since we read it.
func (g *Gate) update(ctx context.Context, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	return g.cfg.Client.Update(ctx, lease, metav1.UpdateOptions{})
}
