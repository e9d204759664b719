package cli

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/taint"
)

// taintFlags configure the startup taint (docs/readiness.md).
type taintFlags struct {
	key          string
	maxWait      time.Duration
	podStartFile string
}

func (t *taintFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&t.key, "startup-taint", "", "taint key to remove from this node once every image is present (or at --startup-taint-max-wait); off when empty")
	fs.DurationVar(&t.maxWait, "startup-taint-max-wait", 20*time.Minute, "remove the startup taint this long after the pod first started even with images missing; 0 keeps it until every image is present")
	fs.StringVar(&t.podStartFile, "pod-start-file", "", "file in the pod's emptyDir recording when the pod first started, so that a restarted container keeps the --startup-taint-max-wait clock; empty: the process start")
}

// initTaint sets up the startup-taint remover. It needs the node label:
// the label says when every image is present, and labeling grants the
// node access.
func (a *agent) initTaint(client kube.Interface) error {
	f := a.flags.startupTaint
	if f.key == "" {
		return nil
	}
	if f.maxWait < 0 {
		return &ExitCodeError{Code: ExitUsage, Err: errors.New("--startup-taint-max-wait must not be negative")}
	}
	if !a.flags.labelNode {
		return &ExitCodeError{Code: ExitUsage, Err: errors.New("--startup-taint needs node labeling (--label-node with --node-name and --instance)")}
	}
	started, err := taint.StartedAt(f.podStartFile, time.Now())
	if err != nil {
		a.log.Warn("startup taint: the pod's start time is unknown; counting maxWait from now", "err", err)
	}
	l := a.labeler
	r := &taint.Remover{
		Nodes: client.Nodes(), Node: a.flags.nodeName, Key: f.key,
		Domain: a.flags.labelDomain, LabelKey: l.Key, Owner: *l.Owner, Pod: l.Pod, List: l.List,
		MaxWait: f.maxWait, Started: started, Events: a.events, Log: a.log,
	}
	if a.metrics != nil {
		r.Metrics = a.metrics
	}
	a.taint = r
	// Every summary written names the taint and this pod's deadline: the
	// other holders of the key wait for it until then.
	l.StartupTaint, l.StartupTaintDeadline = f.key, r.Deadline()
	a.log.Info("startup taint: removing it once every image is present", "taint", f.key, "maxWait", f.maxWait, "podStarted", started.UTC().Format(time.RFC3339), "deadline", r.Deadline())
	return nil
}

// registerTaintTimeout bounds registering as a holder of the taint: a
// registration that cannot be written leaves the other holders not
// waiting for this one, which must not hold up the pull.
const registerTaintTimeout = 15 * time.Second

// registerTaint, on a node that carries the startup taint, writes this
// instance's key at once, failed, every image not checked yet, naming the
// taint and this pod's deadline: another instance that shares the taint
// key then waits for this one before removing it (agent/taint). fetch
// calls it first thing, before the runtime is reached, to keep the window
// in which another instance sees no registration short.
func (a *agent) registerTaint(ctx context.Context) {
	if a.taint == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, registerTaintTimeout)
	defer cancel()
	node, err := a.kube.Nodes().Get(ctx, a.flags.nodeName, metav1.GetOptions{})
	if err != nil {
		a.log.Warn("startup taint: cannot read the node to register as a holder of the taint", "taint", a.taint.Key, "err", err)
		return
	}
	if !taint.Has(node, a.taint.Key) {
		return
	}
	results := make([]pull.Result, len(a.entries))
	for i, e := range a.entries {
		results[i] = pull.Result{Image: e.Ref, Normalized: e.Normalized}
	}
	if err := a.labeler.Apply(ctx, pendingSummary(results)); err != nil {
		// An owner conflict is reported once the pull is over, as before.
		a.log.Warn("startup taint: could not register as a holder of the taint; other instances sharing its key will not wait for this one", "taint", a.taint.Key, "err", err)
		return
	}
	a.pending = true
	a.log.Info("startup taint: registered as a holder of the taint", "taint", a.taint.Key, "deadline", a.taint.Deadline())
}

// taintDone tells the remover what this process's latest check found.
func (a *agent) taintDone(results []pull.Result) {
	if a.taint == nil {
		return
	}
	all := true
	for _, r := range results {
		all = all && r.Present
	}
	a.taint.Done(all)
}

// watchTaint runs the remover in the background until the taint is gone
// or the returned stop is called; stop waits for it to finish.
func (a *agent) watchTaint(ctx context.Context) (stop func()) {
	if a.taint == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.taint.Run(ctx)
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// settleTaint looks at the node once, right after fetch wrote the label:
// with every image present the taint goes now, not a poll later in watch.
func (a *agent) settleTaint(ctx context.Context) {
	if a.taint == nil {
		return
	}
	if _, err := a.taint.Step(ctx); err != nil {
		a.log.Warn("startup taint: not removed yet; watch keeps trying", "taint", a.taint.Key, "err", err)
	}
}

// failOpenTaint keeps maxWait true for an agent that cannot start (the
// runtime unreachable, say): the kubelet restarts fetch, and the first
// restart after maxWait removes the taint, with the Warning Event, instead
// of leaving the node out of service for as long as the fault lasts.
func (a *agent) failOpenTaint(ctx context.Context) {
	if a.taint == nil {
		return
	}
	if _, err := a.taint.Step(ctx); err != nil {
		a.log.Warn("startup taint: checking the node failed", "taint", a.taint.Key, "err", err)
	}
}
