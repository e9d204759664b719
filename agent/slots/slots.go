// Package slots caps how many nodes of a cluster pull images at the same
// time. It hands out K slots, each a coordination.k8s.io/v1 Lease named
// <instance>-slot-<i> in the agent's namespace, and nothing else: the
// agent may create Leases and get, update and delete those K names; it
// may list and watch Leases of its namespace to wait (watch.go).
//
// Taking a slot is an optimistic write: a create for a slot that does not
// exist yet, or an update that carries the resourceVersion we last saw.
// When two nodes race, the apiserver accepts one write and answers the
// other with a conflict, so a slot never has two holders. The holder renews
// while it pulls and clears the holder field when it is done. A holder that
// dies stops renewing; other nodes take its slot once they have seen the
// Lease unchanged for its leaseDurationSeconds, measured on their own clock
// (as client-go's leader election does), so clock skew between nodes
// cannot make a live holder look expired.
//
// A waiting node follows the slots with one watch (watch.go), so that it
// sends no requests while nothing changes; in a large herd it follows only
// some of them (subset.go), so that each event reaches a few dozen waiters
// rather than all. Where the Role does not allow
// that (an older rendering), or Config.Poll says so, it reads the slot
// names in turn instead (polling).
//
// Seed mode lets the first N nodes pull alone: until a seed has finished,
// only slots 0..N-1 may be taken. A seed that finishes records that on the
// slot-0 Lease (annotation SeededAnnotation); from then on all K slots are
// open.
package slots

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

const (
	// DefaultLeaseDuration matches client-go's leader election default: a
	// crashed holder's slot is free again about this long after its last
	// renewal.
	DefaultLeaseDuration = 15 * time.Second
	// DefaultPollInterval is the mean pause between two looks at the slots
	// while all of them are busy, when waiting by polling. Each look is
	// one GET, so a cluster of W polling nodes sends about
	// W/DefaultPollInterval GETs per second.
	DefaultPollInterval = 2 * time.Second
	// DefaultCallTimeout bounds every single API call.
	DefaultCallTimeout = 10 * time.Second
	// DefaultForbiddenFor: a restarted apiserver answers Forbidden until
	// its RBAC caches are filled, which takes seconds.
	DefaultForbiddenFor = 30 * time.Second

	// SeededAnnotation on the slot-0 Lease says that a seed node has
	// finished pulling. Its value is the Config.SeedKey of that seed.
	SeededAnnotation = v1alpha1.LabelDomain + "/seeded"

	// TakeDelayAnnotation on a slot Lease is how long its holder waited,
	// after it saw the slot free, before it took it (a Go duration).
	// Waiters steer their delays by it (watch.go).
	TakeDelayAnnotation = v1alpha1.LabelDomain + "/take-delay"

	// Labels put on the Leases this package creates, so that an
	// administrator can find and delete them.
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	// LabelComponentSlot is the LabelComponent value of slot Leases; the
	// watch selects on it.
	LabelComponentSlot = "pull-slot"
	// LabelSlot is a slot Lease's index, so that a waiter can watch some of
	// the slots with one set-based selector (watch.go).
	LabelSlot = v1alpha1.LabelDomain + "/slot"
)

// LeaseClient reads and writes the slot Leases of Config.Namespace. Its
// methods are those of client-go's typed Lease client, so
// clientset.CoordinationV1().Leases(namespace) is one, and so is the
// agent's own kube.Client.Leases(namespace).
type LeaseClient = kube.LeaseClient

// RESTClientGetter is a client-go API group client, such as a clientset's
// CoordinationV1(), seen only through its REST client. Taking this rather
// than client-go's typed LeasesGetter keeps the typed clientset, and the
// scheme of every API group that comes with it, out of the agent binary.
type RESTClientGetter interface {
	RESTClient() rest.Interface
}

// Config says which slots to use and how.
type Config struct {
	// Client is the Lease client of Namespace. Either Client or Leases is
	// needed; Client wins when both are set.
	Client LeaseClient
	// Leases is a real clientset's CoordinationV1(). The slots use its REST
	// client the way client-go's typed Lease client does. A fake
	// clientset has no REST client: pass its Leases(namespace) as Client.
	Leases RESTClientGetter
	// Namespace holds the slot Leases: the agent's own namespace.
	Namespace string
	// Instance names the slots: <Instance>-slot-0 .. <Instance>-slot-(Slots-1).
	Instance string
	// Slots is K, the number of nodes that may pull at once. At least 1.
	Slots int
	// SeedNodes is N: until one seed has finished, only N nodes pull. 0
	// turns seed mode off. N >= Slots makes it a no-op.
	SeedNodes int
	// SeedKey names what is being seeded, for example a digest of the image
	// list. A finished seed only opens the gate for nodes with the same key,
	// so a new image list is seeded again. Empty means "any seed counts".
	SeedKey string
	// Identity names this agent in holderIdentity, usually the pod name.
	// Each Hold appends a random suffix, so two holds never share a name.
	Identity string
	// LeaseDuration is written to leaseDurationSeconds (whole seconds,
	// rounded up). The holder renews every third of it and gives up the
	// slot, as far as it is concerned, when two thirds pass without a
	// successful renewal. Default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// PollInterval is the mean pause between looks while every slot is
	// busy; each pause is jittered by ±50%. Default DefaultPollInterval.
	PollInterval time.Duration
	// Herd is how many nodes may wait for a slot at once, at most: the
	// number of the instance's pods (its DaemonSet's
	// desiredNumberScheduled). It sizes a waiter's first subset and window
	// (subset.go), which the waiters then correct as they go; 0, unknown,
	// starts with all slots and a window of 5 s.
	Herd int
	// Poll makes waiters read the slot names in turn instead of watching
	// them: the behaviour before watching, kept for comparisons. Waiters
	// poll anyway when the Role does not allow list and watch on Leases.
	Poll bool
	// Resync is the shortest time between two lists of the slots while
	// waiting by watch; each watch lasts a random time between Resync and
	// twice that. Default DefaultResync.
	Resync time.Duration
	// CallTimeout bounds each API call. Default DefaultCallTimeout.
	CallTimeout time.Duration
	// ForbiddenFor is how long every slot may answer Forbidden before the
	// wait ends with an error (missing RBAC). Default DefaultForbiddenFor.
	ForbiddenFor time.Duration
	// Logger receives progress and problems. Default slog.Default().
	Logger *slog.Logger
}

// Gate hands out slots. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	leases LeaseClient
	log    *slog.Logger
	// now is the clock; tests replace it.
	now func() time.Time
	// firstWindow is a waiter's first window and relistBackoff its first
	// pause after a failed list or watch (watch.go); tests shorten them.
	firstWindow   time.Duration
	relistBackoff time.Duration
	// resubsetSpread is the longest a waiter waits before it lists again
	// to watch another subset of the slots (subset.go); tests shorten it.
	resubsetSpread time.Duration
}

// New checks cfg and fills in defaults.
func New(cfg Config) (*Gate, error) {
	client := cfg.Client
	if client == nil && cfg.Leases != nil {
		rc := cfg.Leases.RESTClient()
		if c, ok := rc.(*rest.RESTClient); rc == nil || ok && c == nil {
			return nil, errors.New("slots: no Lease client: Config.Leases has no REST client (a fake clientset?); set Config.Client")
		}
		client = kube.LeasesOver(rc, cfg.Namespace)
	}
	switch {
	case client == nil:
		return nil, errors.New("slots: no Lease client")
	case cfg.Namespace == "":
		return nil, errors.New("slots: no namespace (set POD_NAMESPACE)")
	case cfg.Instance == "":
		return nil, errors.New("slots: no instance name")
	case cfg.Slots < 1:
		return nil, fmt.Errorf("slots: %d slots, need at least 1", cfg.Slots)
	case cfg.SeedNodes < 0, cfg.Herd < 0:
		return nil, fmt.Errorf("slots: %d seed nodes and a herd of %d, need 0 or more", cfg.SeedNodes, cfg.Herd)
	case cfg.Identity == "":
		return nil, errors.New("slots: no holder identity (set POD_NAME)")
	case cfg.LeaseDuration < 0 || cfg.PollInterval < 0 || cfg.CallTimeout < 0 || cfg.Resync < 0:
		return nil, errors.New("slots: negative duration")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	// leaseDurationSeconds is an integer; round up so that we never claim
	// less time than we asked for.
	cfg.LeaseDuration = ((cfg.LeaseDuration + time.Second - 1) / time.Second) * time.Second
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.ForbiddenFor <= 0 {
		cfg.ForbiddenFor = DefaultForbiddenFor
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Gate{
		cfg:    cfg,
		leases: client,
		log:    cfg.Logger.With("component", "slots"),
		now:    time.Now,

		firstWindow:    initialWindow,
		relistBackoff:  minRelistBackoff,
		resubsetSpread: defaultResubsetSpread,
	}, nil
}

// SlotName is the name of slot i of an instance.
func SlotName(instance string, i int) string {
	return fmt.Sprintf("%s-slot-%d", instance, i)
}

// Acquire waits for a slot and returns the function that gives it back.
// It is the agent's pull gate. A slot lost while pulling is logged by the
// Holding; the pull goes on.
func (g *Gate) Acquire(ctx context.Context) (release func(), err error) {
	h, err := g.Hold(ctx)
	if err != nil {
		return nil, err
	}
	return h.Release, nil
}

// Hold waits until it holds a slot, ctx ends, or the API refuses us for
// good (for example, missing RBAC). Transient API errors are logged and
// retried. The caller must call Release on the result.
func (g *Gate) Hold(ctx context.Context) (*Holding, error) {
	start := g.now()
	if !g.cfg.Poll {
		h, err := g.holdWatching(ctx, start)
		if !errors.Is(err, errCannotWatch) {
			return h, err
		}
		g.log.Warn("cannot watch the pull slots (the Role lacks list or watch on leases: render it again); waiting by polling", "err", err)
	}
	return g.holdPolling(ctx, start)
}

func (g *Gate) logAcquired(h *Holding, start time.Time, attrs ...any) {
	g.log.Info("acquired pull slot", append([]any{"slot", h.Name(), "holder", h.id, "seed", h.seed,
		"waited", g.now().Sub(start).Round(time.Millisecond).String()}, attrs...)...)
}

func (g *Gate) newWaiter() *waiter {
	return &waiter{
		g:      g,
		id:     g.cfg.Identity + "-" + randomSuffix(),
		seen:   make([]observation, g.cfg.Slots),
		denied: make([]bool, g.cfg.Slots),
		seeded: g.cfg.SeedNodes == 0,
		next:   randomIntN(g.cfg.Slots),
	}
}

// holdPolling waits by reading the slots by name: every eligible slot
// once, then one per PollInterval.
func (g *Gate) holdPolling(ctx context.Context, start time.Time) (*Holding, error) {
	w := g.newWaiter()
	loggedWait := false
	for sweep := true; ; sweep = false {
		h, err := w.round(ctx, sweep)
		if err != nil {
			return nil, err
		}
		if h != nil {
			g.logAcquired(h, start)
			return h, nil
		}
		if !loggedWait {
			loggedWait = true
			if w.seeded {
				g.log.Info("all pull slots are busy; waiting", "slots", g.cfg.Slots)
			} else {
				g.log.Info("seed nodes are pulling; waiting for one to finish", "seedNodes", g.cfg.SeedNodes)
			}
		}
		t := time.NewTimer(jitter(g.cfg.PollInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for a pull slot: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// observation remembers when this waiter first saw a slot's current
// version, on its own clock.
type observation struct {
	resourceVersion string
	since           time.Time
}

// waiter is the state of one Hold.
type waiter struct {
	g      *Gate
	id     string
	seen   []observation
	seeded bool
	next   int
	// denied marks the slots the API refused us (Forbidden). When
	// maxConcurrentNodes is lowered, the Role loses the higher slot names
	// at once while old pods still count them; those are skipped.
	denied []bool
	// allDenied is when every eligible slot was first found forbidden;
	// zero while some slot is not.
	allDenied time.Time
}

// eligible is the number of slots that may be taken now.
func (w *waiter) eligible() int {
	if w.seeded {
		return w.g.cfg.Slots
	}
	return min(w.g.cfg.SeedNodes, w.g.cfg.Slots)
}

// round looks at the slots once: all eligible ones in a sweep, otherwise
// one, chosen round-robin so that a lone waiter visits every slot. While
// seeding is not over it reads slot 0 first, because slot 0 says whether
// it is.
func (w *waiter) round(ctx context.Context, sweep bool) (*Holding, error) {
	tried0 := false
	if !w.seeded {
		tried0 = true
		if h, err := w.try(ctx, 0); h != nil || err != nil {
			return h, err
		}
	}
	n := w.eligible()
	var candidates []int // eligible slots not yet read in this round, round-robin
	for k := range n {
		i := (w.next + k) % n
		if !(i == 0 && tried0) && !w.denied[i] {
			candidates = append(candidates, i)
		}
	}
	if !sweep {
		candidates = candidates[:min(1, len(candidates))]
	}
	for _, i := range candidates {
		w.next = (i + 1) % w.g.cfg.Slots
		if h, err := w.try(ctx, i); h != nil || err != nil {
			return h, err
		}
	}
	return nil, nil
}

// try reads slot i and takes it if it is free or expired. It returns
// (nil, nil) when the slot is busy or someone else won the race, and an
// error only when retrying cannot help.
func (w *waiter) try(ctx context.Context, i int) (*Holding, error) {
	g := w.g
	name := SlotName(g.cfg.Instance, i)
	lease, err := g.get(ctx, name)
	now := g.now()
	if apierrors.IsNotFound(err) {
		w.recheckSeeded(ctx, i)
		seed := !w.seeded
		created, err := g.create(ctx, g.newLease(i, w.id, now))
		if err != nil {
			return nil, w.failed("create", i, err)
		}
		return g.newHolding(created, i, w.id, seed, now), nil
	}
	if err != nil {
		return nil, w.failed("get", i, err)
	}
	w.allDenied = time.Time{}
	if i == 0 && !w.seeded && seededBy(lease, g.seedValue()) {
		w.seeded = true
		g.log.Info("a seed node has finished; all pull slots are open", "slots", g.cfg.Slots)
	}
	if lease.ResourceVersion != w.seen[i].resourceVersion {
		w.seen[i] = observation{resourceVersion: lease.ResourceVersion, since: now}
	}
	if holder(lease) != "" && now.Sub(w.seen[i].since) < g.duration(lease) {
		return nil, nil
	}
	if holder(lease) != "" {
		g.log.Info("taking over expired pull slot", "slot", name, "previousHolder", holder(lease))
	}
	// A seed is whoever takes a slot before seeding is known to be over;
	// that includes nodes taking over a crashed seed's slot.
	w.recheckSeeded(ctx, i)
	seed := !w.seeded
	updated, err := g.update(ctx, g.takeover(lease, i, w.id, now))
	if err != nil {
		return nil, w.failed("update", i, err)
	}
	return g.newHolding(updated, i, w.id, seed, now), nil
}

// recheckSeeded reads slot 0 again before slot i is taken while seeding
// is on: a finished seed marks slot 0 before it frees its own slot, and
// that slot may be the one read after slot 0 was. Without the second read
// the node would take it as a seed, and mark slot 0 again when done.
func (w *waiter) recheckSeeded(ctx context.Context, i int) {
	if w.seeded || i == 0 {
		return
	}
	if l, err := w.g.get(ctx, SlotName(w.g.cfg.Instance, 0)); err == nil && seededBy(l, w.g.seedValue()) {
		w.seeded = true
		w.g.log.Info("a seed node has finished; all pull slots are open", "slots", w.g.cfg.Slots)
	}
}

// failed is Gate.failed for slot i, except that Forbidden ends the wait
// only once every eligible slot was refused: after maxConcurrentNodes was
// lowered, the slots still named in the Role are free to use.
func (w *waiter) failed(verb string, i int, err error) error {
	g := w.g
	name := SlotName(g.cfg.Instance, i)
	if !apierrors.IsForbidden(err) {
		return g.failed(verb, name, err)
	}
	if !w.denied[i] {
		w.denied[i] = true
		g.log.Warn("not allowed to use this pull slot (was maxConcurrentNodes lowered?); skipping it", "slot", name, "verb", verb, "err", err)
	}
	for k := range w.eligible() {
		if !w.denied[k] {
			return nil
		}
	}
	// Every slot refused. An apiserver that has just restarted answers
	// Forbidden for a moment, until its RBAC caches are filled; missing
	// RBAC does not go away. So the slots are read again for a while,
	// then the wait ends.
	now := g.now()
	if w.allDenied.IsZero() {
		w.allDenied = now
	}
	if now.Sub(w.allDenied) >= g.cfg.ForbiddenFor {
		return fmt.Errorf("%s Lease %s/%s (every slot refused for %s): %w", verb, g.cfg.Namespace, name, g.cfg.ForbiddenFor, err)
	}
	clear(w.denied)
	return nil
}

// failed turns an API error from a waiter into what the caller should do:
// nil to keep waiting (lost race, transient trouble) or an error to give up.
func (g *Gate) failed(verb, name string, err error) error {
	switch {
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err):
		// Someone else wrote first. Not a problem: look elsewhere.
		return nil
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsInvalid(err),
		apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
		return fmt.Errorf("%s Lease %s/%s: %w", verb, g.cfg.Namespace, name, err)
	default:
		g.log.Warn("pull slot API call failed; will retry", "verb", verb, "slot", name, "err", err)
		return nil
	}
}

func (g *Gate) seedValue() string {
	if g.cfg.SeedKey != "" {
		return g.cfg.SeedKey
	}
	return "true"
}

func seededBy(lease *coordinationv1.Lease, value string) bool {
	return lease.Annotations[SeededAnnotation] == value
}

func holder(lease *coordinationv1.Lease) string {
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// duration is how long a Lease stays valid after a renewal: its own
// leaseDurationSeconds, so that a holder configured differently (say,
// during a rollout) is judged by what it promised.
func (g *Gate) duration(lease *coordinationv1.Lease) time.Duration {
	if d := lease.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		return time.Duration(*d) * time.Second
	}
	return g.cfg.LeaseDuration
}

func (g *Gate) heldSpec(id string, now time.Time) coordinationv1.LeaseSpec {
	secs := int32(g.cfg.LeaseDuration / time.Second)
	t := metav1.NewMicroTime(now)
	return coordinationv1.LeaseSpec{
		HolderIdentity:       &id,
		LeaseDurationSeconds: &secs,
		AcquireTime:          &t,
		RenewTime:            &t,
	}
}

// takeover is lease with us as its new holder. It also puts our labels on
// it: a slot Lease made without them (by hand, say) is invisible to the
// waiters' watch until then.
func (g *Gate) takeover(lease *coordinationv1.Lease, i int, id string, now time.Time) *coordinationv1.Lease {
	next := lease.DeepCopy()
	transitions := int32(0)
	if lease.Spec.LeaseTransitions != nil {
		transitions = *lease.Spec.LeaseTransitions
	}
	transitions++ // every holder after the creator counts as a transition
	next.Spec = g.heldSpec(id, now)
	next.Spec.LeaseTransitions = &transitions
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	maps.Copy(next.Labels, g.labels(i))
	return next
}

// labels are the labels of slot i's Lease.
func (g *Gate) labels(i int) map[string]string {
	return map[string]string{
		LabelName:      "image-prefetcher",
		LabelInstance:  g.cfg.Instance,
		LabelComponent: LabelComponentSlot,
		LabelSlot:      strconv.Itoa(i),
	}
}

func (g *Gate) newLease(i int, id string, now time.Time) *coordinationv1.Lease {
	zero := int32(0)
	spec := g.heldSpec(id, now)
	spec.LeaseTransitions = &zero
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: SlotName(g.cfg.Instance, i), Namespace: g.cfg.Namespace, Labels: g.labels(i)},
		Spec:       spec,
	}
}

// The API calls, each under its own timeout.

func (g *Gate) get(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	return g.leases.Get(ctx, name, metav1.GetOptions{})
}

func (g *Gate) create(ctx context.Context, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	return g.leases.Create(ctx, lease, metav1.CreateOptions{})
}

// update carries lease.ResourceVersion, so the apiserver rejects it with
// a conflict if anyone wrote the Lease since we read it.
func (g *Gate) update(ctx context.Context, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	return g.leases.Update(ctx, lease, metav1.UpdateOptions{})
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// jitter spreads waiters out so that they do not poll in lockstep.
func jitter(d time.Duration) time.Duration {
	return d/2 + mrand.N(d+1)
}

func randomIntN(n int) int {
	return mrand.IntN(n)
}
