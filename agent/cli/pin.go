package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// pinFlags configure pinning (agent/pin, docs/agent.md).
type pinFlags struct {
	enabled bool
	budget  string
	parsed  v1alpha1.PinBudget
}

func (p *pinFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&p.enabled, "pin", true, "pin the list's images in containerd, so that the kubelet's image garbage collection keeps them; false removes this instance's pins")
	fs.StringVar(&p.budget, "pin-budget", v1alpha1.DefaultPinBudget, "the most the pinned images may take on the image filesystem: a share of its capacity (25%) or bytes (20Gi); images beyond it are pulled but not pinned")
}

func (p *pinFlags) validate() error {
	b, err := v1alpha1.ParsePinBudget(p.budget)
	if err != nil {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--pin-budget: %w", err)}
	}
	p.parsed = b
	return nil
}

// initPins sets up the pinner once the runtime is known. Pins are marked
// with the instance's namespace and name: without them nothing is pinned.
// With pinning off, a containerd still gets a pinner, without a budget,
// which removes the pins this instance set before.
func (a *agent) initPins(runtime, version string, capacity func(context.Context) (uint64, error)) {
	f := a.flags
	if f.namespace == "" || f.instance == "" {
		if f.pin.enabled {
			a.log.Info("not pinning images: --namespace and --instance (or POD_NAMESPACE and INSTANCE_NAME) name the owner of the pins")
		}
		return
	}
	if !f.pin.enabled && runtime != "containerd" {
		return
	}
	p := &pin.Pinner{
		Store: pin.NewContainerd(a.cri.Conn()), CRI: statusBound{Runtime: a.cri, timeout: f.statusTimeout},
		Namespace: f.namespace, Name: f.instance, Log: a.log,
	}
	a.pinner = p
	if !f.pin.enabled {
		return
	}
	b := f.pin.parsed
	p.Budget = func(ctx context.Context) (uint64, error) {
		if !b.IsShare {
			return b.Bytes, nil
		}
		c, err := capacity(ctx)
		if err != nil {
			return 0, fmt.Errorf("%s of the image filesystem: %w", b, err)
		}
		return b.Of(c), nil
	}
	why, verify := pin.Check(runtime, version)
	p.Verify = verify
	if why != "" {
		p.Unsupported = why
		a.log.Warn("this node's runtime cannot pin images; prefetched images are not protected from the kubelet's image garbage collection", "runtime", runtime, "version", version, "why", why)
		return
	}
	a.log.Info("pinning the list's images", "budget", b.String())
}

// imageFsCapacity reads the capacity of the runtime's image filesystem.
func imageFsCapacity(r disk.Reader) func(context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		u, err := r.Read(ctx)
		if err != nil {
			return 0, err
		}
		return u.CapacityBytes, nil
	}
}

// syncPins makes the pins follow a check's results, and returns what the
// annotation says about them (nil when pinning is off).
func (a *agent) syncPins(ctx context.Context, results []pull.Result) *label.Pins {
	if a.pinner == nil {
		return nil
	}
	pins := a.pinner.Sync(ctx, results)
	if a.metrics != nil {
		unsupported := 0.0
		if pins != nil && pins.Unsupported != "" {
			unsupported = 1
		}
		a.metrics.PinUnsupported.Set(unsupported)
	}
	return pins
}

// pinBehind pins while fetch labels the node, so that pinning never holds
// the label up; watch's first check, right after fetch, writes the pins
// into the annotation. A runtime that cannot pin is said at once, which
// costs nothing, in fetch's own annotation. wait returns once the pins are
// set.
func (a *agent) pinBehind(ctx context.Context, results []pull.Result) (pins *label.Pins, wait func()) {
	if a.pinner == nil || a.pinner.Unsupported != "" {
		return a.syncPins(ctx, results), func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.syncPins(ctx, results)
	}()
	return nil, func() { <-done }
}

// unpinFor is how long removing the pins may take on uninstall, after the
// label: within the pod's default grace period of 30 s, which the rendered
// DaemonSet keeps, less the label's budget and a margin. Nothing else
// removes an uninstalled instance's pins, so they get all the time the
// kubelet gives.
const unpinFor = 20 * time.Second

// unpinAll removes this instance's pins when it leaves the node, giving up
// at deadline, or unpinFor from now if that is later: the label, whose
// removal the deadline is for, went first. ctx is the command's context,
// already done: only its values are kept.
func (a *agent) unpinAll(ctx context.Context, deadline time.Time) {
	if a.pinner == nil || a.pinner.Unsupported != "" {
		return
	}
	if soon := time.Now().Add(unpinFor); deadline.Before(soon) {
		deadline = soon
	}
	uctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	n, err := a.pinner.UnpinAll(uctx)
	if err != nil {
		a.log.Error("removing this instance's pins failed; they stay until the instance runs on this node again", "unpinned", n, "err", err)
		return
	}
	a.log.Info("removed this instance's pins", "records", n)
}
