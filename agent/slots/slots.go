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
	// DefaultCallTimeout bounds each API call.
	DefaultCallTimeout = 10 * time.Second
	// DefaultRefusedFor is how long the API may refuse every slot, or the
	// list, before the wait ends: the agent's one span for refusals.
	DefaultRefusedFor = kube.RefusedFor
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
	// Client is the Lease client of Namespace, the agent's own namespace.
	Client    LeaseClient
	Namespace string
	// Instance names the slots: <Instance>-slot-0 .. <Instance>-slot-(K-1).
	Instance string
	// Slots is K, the number of nodes that may pull at once.
	Slots int
	// SeedNodes is N, how many pull until one seed has finished (0: no
	// seed mode).
	SeedNodes int
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
	// ended, a release already in flight included. Default
	// DefaultReleaseGrace.
	ReleaseGrace time.Duration
	// CallTimeout bounds each API call. Default DefaultCallTimeout.
	CallTimeout time.Duration
	// RefusedFor is how long the API may refuse (403, 401) every slot, or
	// the list, before the wait ends with an error. Default
	// DefaultRefusedFor.
	RefusedFor time.Duration
	// Logger receives progress and problems. Default slog.Default().
	Logger *slog.Logger
}

// Gate hands out slots. It is safe for concurrent use.
type Gate struct {
	cfg Config
	log *slog.Logger
	// selector and ticketSelector pick the instance's slot Leases and
	// tickets.
	selector       string
	ticketSelector string
	// The clock and the first pause after a failed call (wait.go); tests
	// replace them.
	now   func() time.Time
	retry time.Duration
}

// New checks cfg and fills in defaults. The agent's flags are checked
// where they are read (agent/cli); New checks again, so that no caller
// gets a gate that can never hand out a slot.
func New(cfg Config) (*Gate, error) {
	if err := check(cfg); err != nil {
		return nil, fmt.Errorf("slots: %w", err)
	}
	// leaseDurationSeconds is whole: rounded up, never less than asked.
	duration := cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.LeaseDuration = (duration + time.Second - 1).Truncate(time.Second)
	cfg.CallTimeout = cmp.Or(cfg.CallTimeout, DefaultCallTimeout)
	cfg.ReleaseGrace = cmp.Or(cfg.ReleaseGrace, DefaultReleaseGrace)
	cfg.RefusedFor = cmp.Or(cfg.RefusedFor, DefaultRefusedFor)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.SeedKey = cmp.Or(cfg.SeedKey, "true")
	selector := labels.SelectorFromSet(labels.Set{LabelInstance: cfg.Instance, LabelComponent: LabelComponentSlot})
	tickets := labels.SelectorFromSet(labels.Set{LabelInstance: cfg.Instance, LabelComponent: LabelComponentTicket})
	g := &Gate{
		cfg:            cfg,
		log:            cfg.Logger.With("component", "slots"),
		selector:       selector.String(),
		ticketSelector: tickets.String(),
		now:            time.Now,
		retry:          minRetry,
	}
	return g, nil
}

// check says what in cfg makes a gate that cannot work.
func check(cfg Config) error {
	switch {
	case cfg.Client == nil:
		return errors.New("no Lease client")
	case cfg.Namespace == "":
		return errors.New("no namespace (set POD_NAMESPACE)")
	case cfg.Instance == "":
		return errors.New("no instance name")
	case cfg.Slots < 1:
		return fmt.Errorf("%d slots, need at least 1", cfg.Slots)
	case cfg.SeedNodes < 0:
		return fmt.Errorf("%d seed nodes, need 0 (no seed mode) or more", cfg.SeedNodes)
	case cfg.Identity == "":
		return errors.New("no holder identity (set POD_NAME)")
	}
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"lease duration", cfg.LeaseDuration},
		{"call timeout", cfg.CallTimeout},
		{"release grace", cfg.ReleaseGrace},
		{"refusal span", cfg.RefusedFor},
	}
	for _, d := range durations {
		if d.d < 0 {
			return fmt.Errorf("negative %s %s", d.name, d.d)
		}
	}
	return nil
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
	w := g.newWaiter(ctx)
	h, err := w.wait()
	w.leave(h)
	if err != nil {
		g.disownAll(w.unsure)
		return nil, err
	}
	g.log.Info("acquired pull slot", "slot", h.Name(), "holder", h.id, "seed", h.seed,
		"waited", g.now().Sub(start).Round(time.Millisecond).String())
	return h, nil
}

// disownAll clears, within Config.ReleaseGrace, the slots that takes
// whose answer never came may have written, when the wait ends without a
// slot: nobody would renew them.
func (g *Gate) disownAll(unsure []take) {
	if len(unsure) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.ReleaseGrace)
	defer cancel()
	for _, t := range unsure {
		name := SlotName(g.cfg.Instance, t.slot)
		cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := g.disown(ctx, cur, t.id); err != nil {
			g.log.Error("could not clear a pull slot an unanswered take may have written;"+
				" it frees itself after the lease duration", "slot", name, "holder", t.id, "err", err)
		}
	}
}

// slotIndex is the index of the slot named name, -1 if it is none of ours.
func (g *Gate) slotIndex(name string) int {
	for i := range g.cfg.Slots {
		if SlotName(g.cfg.Instance, i) == name {
			return i
		}
	}
	return -1
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
	meta := metav1.ObjectMeta{Name: SlotName(g.cfg.Instance, i), Namespace: g.cfg.Namespace}
	next := &coordinationv1.Lease{ObjectMeta: meta}
	transitions := int32(0)
	if prev != nil {
		next = prev.DeepCopy()
		transitions = ptr.Deref(prev.Spec.LeaseTransitions, 0) + 1
	}
	secs := int32(g.cfg.LeaseDuration / time.Second)
	t := metav1.NewMicroTime(now)
	next.Spec = coordinationv1.LeaseSpec{
		HolderIdentity:       &id,
		LeaseDurationSeconds: &secs,
		AcquireTime:          &t,
		RenewTime:            &t,
		LeaseTransitions:     &transitions,
	}
	// The waiters' lists select on these labels.
	ours := map[string]string{
		LabelName:      "image-prefetcher",
		LabelInstance:  g.cfg.Instance,
		LabelComponent: LabelComponentSlot,
	}
	next.Labels = labels.Merge(next.Labels, ours)
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
