package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/image-prefetcher/image-prefetcher/agent/creds"
	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/gcguard"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/metrics"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/taint"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// agentFlags are shared by fetch and watch, with the reference agent's
// names and defaults so that existing manifests keep working.
type agentFlags struct {
	criSocket             string
	imageListFile         string
	dockerConfigs         []string
	initialAttemptTimeout time.Duration
	maxAttemptTimeout     time.Duration
	overallTimeout        time.Duration
	initialDelay          time.Duration
	maxDelay              time.Duration
	providerConfig        string
	providerBinDir        string
	parallelism           int
	pullPolicy            string
	nodeName              string
	instance              string
	namespace             string
	labelDomain           string
	labelNode             bool
	kubeconfig            string
	maxConcurrentNodes    int
	seedNodes             int
	metricsAddr           string
	versionRetryFor       time.Duration
	permanentAttempts     int
	labelRetryFor         time.Duration
	statusTimeout         time.Duration
	startupTaint          taintFlags
	pin                   pinFlags
	diskCeilingPercent    int
	kubeletStats          bool

	// Set from the command line by parsed.
	labelNodeSet bool

	// Reference agent flags, accepted so that its manifests keep working.
	debug           bool
	metricsEndpoint string
}

func (f *agentFlags) register(cmd *cobra.Command, deps *Deps) {
	getenv := deps.Getenv
	fs := cmd.Flags()
	fs.StringVar(&f.criSocket, "cri-socket", cri.DefaultSocket, "path of the CRI socket of the container runtime")
	fs.StringVar(&f.imageListFile, "image-list-file", "", "file with one image reference per line")
	fs.StringArrayVar(&f.dockerConfigs, "docker-config", nil, "pull secret: a directory holding .dockerconfigjson and/or .dockercfg, or one such file (repeatable)")
	fs.DurationVar(&f.initialAttemptTimeout, "initial-pull-attempt-timeout", 30*time.Second, "timeout of the first pull attempt of an image; doubles on each attempt")
	fs.DurationVar(&f.maxAttemptTimeout, "max-pull-attempt-timeout", 5*time.Minute, "largest timeout of one pull attempt")
	fs.DurationVar(&f.overallTimeout, "overall-timeout", 20*time.Minute, "time allowed for pulling the whole list, counted from when pulling starts: after the ImageStatus checks and the herd-control slot")
	fs.DurationVar(&f.initialDelay, "initial-pull-attempt-delay", time.Second, "delay before the second attempt of an image; doubles on each attempt, ±20% jitter")
	fs.DurationVar(&f.maxDelay, "max-pull-attempt-delay", 10*time.Minute, "largest delay between attempts of an image")
	fs.StringVar(&f.providerConfig, "image-credential-provider-config", "", "kubelet CredentialProviderConfig file for exec credential plugins")
	fs.StringVar(&f.providerBinDir, "image-credential-provider-bin-dir", "", "directory holding the credential plugin binaries")
	fs.IntVar(&f.parallelism, "parallelism", 4, "images pulled at the same time")
	fs.StringVar(&f.pullPolicy, "pull-policy", string(v1alpha1.PullKubelet), "Kubelet (Always for :latest or untagged, IfNotPresent otherwise), IfNotPresent or Always")
	fs.StringVar(&f.nodeName, "node-name", getenv("NODE_NAME"), "name of this node (default $NODE_NAME)")
	fs.StringVar(&f.instance, "instance", getenv("INSTANCE_NAME"), "ImagePrefetcher instance name, the label key suffix (default $INSTANCE_NAME)")
	fs.StringVar(&f.namespace, "namespace", deps.podNamespace(), "namespace of the ImagePrefetcher instance, recorded as the owner of the node key (default $POD_NAMESPACE, else the pod's service-account namespace file)")
	fs.StringVar(&f.labelDomain, "label-domain", v1alpha1.LabelDomain, "prefix of the node label and annotation key")
	fs.BoolVar(&f.labelNode, "label-node", true, "write the node label and annotation")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster, then $KUBECONFIG or ~/.kube/config")
	fs.IntVar(&f.maxConcurrentNodes, "max-concurrent-nodes", 0, "nodes of this instance pulling at the same time; 0 means no limit")
	fs.IntVar(&f.seedNodes, "seed-nodes", 0, "nodes that pull first before the others start (with --max-concurrent-nodes)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "address serving /metrics and /healthz, e.g. :9100; off when empty")
	fs.DurationVar(&f.versionRetryFor, "cri-connect-timeout", 30*time.Second, "how long to wait for the runtime to answer its first call")
	fs.IntVar(&f.permanentAttempts, "permanent-error-attempts", 3, "attempts for an image whose errors are permanent (not found, unauthorized)")
	fs.DurationVar(&f.labelRetryFor, "label-retry-timeout", 2*time.Minute, "how long transient API errors are retried when labeling")
	f.startupTaint.register(fs)
	f.pin.register(fs)
	fs.BoolVar(&f.kubeletStats, "kubelet-stats", true, "read the image filesystem's figures from this node's kubelet (get nodes/stats) when neither a mount of it nor the agent's own root filesystem tells them")
	fs.IntVar(&f.diskCeilingPercent, "disk-ceiling-percent", int(v1alpha1.DefaultDiskCeilingPercent), "no pull starts once the runtime's image filesystem is this full (percent, as the kubelet counts it), and pulls in flight stop before it is")
	_ = fs.MarkHidden("permanent-error-attempts")
	_ = fs.MarkHidden("label-retry-timeout")

	// The reference agent's other fetch flags. MarkDeprecated also hides
	// them from the help and prints a notice when one is used.
	fs.BoolVar(&f.debug, "debug", false, "log at debug level")
	_ = fs.MarkDeprecated("debug", "use --log-level=debug")
	fs.DurationVar(&f.statusTimeout, "image-list-timeout", time.Minute, "timeout of each ImageStatus call")
	_ = fs.MarkDeprecated("image-list-timeout", "it now bounds each ImageStatus call (there is no image list call); the default, 1m, needs no setting")
	fs.StringVar(&f.metricsEndpoint, "metrics-endpoint", "", "the reference agent's gRPC metrics aggregator")
	_ = fs.MarkDeprecated("metrics-endpoint", "it is ignored: there is no metrics aggregator; serve Prometheus metrics with --metrics-addr")
}

// parsed records what only the command line can tell, once it is parsed.
func (f *agentFlags) parsed(cmd *cobra.Command) {
	f.labelNodeSet = cmd.Flags().Changed("label-node")
}

func (f *agentFlags) validate() error {
	switch v1alpha1.PullPolicy(f.pullPolicy) {
	case v1alpha1.PullKubelet, v1alpha1.PullIfNotPresent, v1alpha1.PullAlways:
	default:
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--pull-policy %q: want Kubelet, IfNotPresent or Always", f.pullPolicy)}
	}
	if f.parallelism < 1 {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--parallelism must be at least 1")}
	}
	if f.maxConcurrentNodes < 0 || f.seedNodes < 0 {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--max-concurrent-nodes and --seed-nodes must not be negative")}
	}
	if f.diskCeilingPercent < 1 || f.diskCeilingPercent > 100 {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--disk-ceiling-percent must be between 1 and 100")}
	}
	if f.statusTimeout <= 0 {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--image-list-timeout must be positive")}
	}
	if owner := v1alpha1.TaintOwner(f.startupTaint.key); owner != "" {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--startup-taint %q: %s sets and removes taints with this key; use a key of your own", f.startupTaint.key, owner)}
	}
	if err := f.pin.validate(); err != nil {
		return err
	}
	if missing := f.labelingMissing(); f.labelNode && missing != "" && f.labelNodeSet {
		return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("--label-node needs %s", missing)}
	}
	return nil
}

// labelingMissing names what labeling lacks, or is empty.
func (f *agentFlags) labelingMissing() string {
	var missing []string
	if f.nodeName == "" {
		missing = append(missing, "--node-name (or NODE_NAME)")
	}
	if f.instance == "" {
		missing = append(missing, "--instance (or INSTANCE_NAME)")
	}
	// The namespace names the owner of the node key: without it the agent
	// could not tell its key from another instance's of the same name.
	if f.namespace == "" {
		missing = append(missing, "--namespace (or POD_NAMESPACE, or the service-account namespace file)")
	}
	if len(missing) > 1 {
		return strings.Join(missing[:len(missing)-1], ", ") + " and " + missing[len(missing)-1]
	}
	return strings.Join(missing, "")
}

// agent is everything fetch and watch share once flags are parsed.
type agent struct {
	flags   *agentFlags
	deps    *Deps
	log     *slog.Logger
	entries []imagelist.Entry
	// digest names the list (imagelist.List.Digest).
	digest  string
	cri     *cri.Client
	puller  *pull.Puller
	labeler *label.Labeler
	events  *events.Recorder
	metrics *metrics.Metrics
	// disk holds pulls below the disk ceiling.
	disk *disk.Guard
	// removals notices images leaving the node between watch's checks.
	removals *removals
	// guard holds back the re-download of an image the node's image GC
	// keeps removing (gchold.go).
	guard gcguard.Guard
	// taint is nil unless --startup-taint is set.
	taint *taint.Remover
	// pinner is nil when nothing is pinned (agent/cli/pin.go).
	pinner *pin.Pinner
	// releaseGrace bounds giving back the herd-control slot once the run
	// was terminated (the package's releaseGrace when 0).
	releaseGrace time.Duration
	// serveCtx, when set, bounds the metrics server instead of init's
	// context: fetch's context ends with SIGTERM handling, and /metrics
	// stays up until the command returns.
	serveCtx context.Context
	// onWaiting, when set, is the puller's Waiting hook (watch's keeper).
	onWaiting func([]pull.Result)
	// afterPull, when set, is called as soon as a check's pulls are over.
	afterPull func()
	// kube is the API client (nil without one); pod and namespace are the
	// agent's own pod's (empty outside a pod).
	kube           kube.Interface
	pod, namespace string
	// labelMu serializes label rewrites.
	labelMu sync.Mutex
	// written is the summary this process last wrote on the node: a
	// different one found there later means another writer.
	written *label.Summary
	// registers: this command registers as a holder of the startup taint
	// at start (fetch).
	registers bool
	// pending: this run wrote the key before its pull ended (registering,
	// or announcing the images it pulls).
	pending bool
}

// newAgent returns an agent that init will set up.
func newAgent(f *agentFlags, deps *Deps) *agent {
	return &agent{flags: f, deps: deps, log: slog.Default()}
}

// init reads the list and credentials and connects to the API server and
// the runtime. On error, the fields set so far stay set: watch, stopped by
// SIGTERM while the runtime is still starting, still removes the label that
// fetch wrote.
func (a *agent) init(ctx context.Context, args []string) error {
	f, deps := a.flags, a.deps
	if err := f.validate(); err != nil {
		return err
	}
	log := slog.Default().With("node", f.nodeName, "instance", f.instance)
	a.log = log
	// The reference agent's manifests set neither the node name nor the
	// instance, and labeling is on by default: they would stop working if
	// that were an error. Asking for labeling explicitly still is one.
	if missing := f.labelingMissing(); f.labelNode && missing != "" {
		log.Warn("not labeling the node: "+missing+" unset; set them, or pass --label-node=false to go without labeling and without this warning", "missing", missing)
		f.labelNode = false
	}
	if f.metricsEndpoint != "" {
		log.Warn("--metrics-endpoint is ignored: the reference agent's metrics aggregator is not supported; serve Prometheus metrics with --metrics-addr (for example --metrics-addr=:9100) and scrape /metrics", "metricsEndpoint", f.metricsEndpoint)
	}

	var text string
	if f.imageListFile != "" {
		data, err := os.ReadFile(f.imageListFile)
		if err != nil {
			return fmt.Errorf("read image list: %w", err)
		}
		text = string(data)
	}
	list := loadList(text, args)
	for _, d := range list.Duplicates {
		log.Info("duplicate image ignored", "line", d.Line, "image", d.Ref, "sameAsLine", d.FirstLine)
	}
	for _, e := range list.Invalid() {
		log.Error("invalid image reference; not attempted", "line", e.Line, "image", e.Ref, "err", e.Err)
	}
	if len(list.Entries) == 0 {
		log.Warn("the image list is empty")
	}
	a.entries, a.digest = list.Entries, list.Digest()

	// An unusable pull secret or plugin config is logged and skipped rather
	// than fatal: the images that needed it then fail as Unauthorized, and
	// the label says so, where a crash loop would leave no label at all.
	// The pull secrets are read now, so that a bad one shows in the log at
	// once, and again whenever the kubelet updates them.
	provider := &creds.Provider{Log: log, Secrets: &creds.DockerConfigs{Paths: f.dockerConfigs, Log: log}}
	provider.Secrets.Refresh()
	if f.providerConfig != "" {
		if f.providerBinDir == "" {
			return &ExitCodeError{Code: ExitUsage, Err: errors.New("--image-credential-provider-config needs --image-credential-provider-bin-dir")}
		}
		plugins, err := creds.LoadProviderConfig(f.providerConfig, f.providerBinDir)
		if err != nil {
			log.Error("credential provider config unusable; continuing without plugins", "err", err)
		}
		provider.Plugins = plugins
	}

	var client kube.Interface
	pod, ns := deps.Getenv("POD_NAME"), deps.podNamespace()
	if f.labelNode || f.maxConcurrentNodes > 0 || (pod != "" && ns != "") {
		k, err := deps.Kube(f.kubeconfig)
		if err != nil {
			return err
		}
		client = k
	}
	a.kube, a.pod, a.namespace = client, pod, ns
	a.events = &events.Recorder{Client: client, Pod: pod, PodUID: deps.Getenv("POD_UID"), Namespace: ns, Component: events.Component, Host: f.nodeName, Log: log}
	if err := a.checkNamespace(ctx, deps.Getenv(v1alpha1.EnvInstanceNamespace)); err != nil {
		return err
	}
	if f.labelNode {
		owner := label.AgentOwner(f.namespace, f.instance, pod)
		a.labeler = &label.Labeler{Nodes: client.Nodes(), Node: f.nodeName, Key: label.Key(f.labelDomain, f.instance), Owner: &owner, Log: log, RetryFor: f.labelRetryFor, Sleep: deps.LabelSleep,
			Pod: deps.Getenv("POD_UID"), List: a.digest, Credentials: len(f.dockerConfigs) > 0 || f.providerConfig != "",
			Removals: a.gcRemovals}
		a.restoreGC(ctx)
	}

	gate, err := deps.NewGate(ctx, GateConfig{Kube: client, Namespace: ns, Pod: pod, Node: f.nodeName, Instance: f.instance,
		MaxConcurrentNodes: f.maxConcurrentNodes, SeedNodes: f.seedNodes, SeedKey: a.digest,
		ReleaseGrace: cmp.Or(a.releaseGrace, releaseGrace), Log: log})
	if err != nil {
		return fmt.Errorf("herd control: %w", err)
	}

	if f.metricsAddr != "" {
		a.metrics = metrics.New()
		sctx := ctx
		if a.serveCtx != nil {
			sctx = a.serveCtx
		}
		if _, err := a.metrics.Serve(sctx, f.metricsAddr, log); err != nil {
			return err
		}
	}
	if err := a.initTaint(client); err != nil {
		return err
	}
	if a.registers {
		a.registerTaint(ctx)
	}

	c, err := cri.Dial(f.criSocket)
	if err != nil {
		return err
	}
	a.cri = c
	runtimeName, version, err := a.runtimeVersion(ctx)
	if err != nil {
		c.Close()
		a.cri = nil
		return err
	}
	figures := disk.Reader{Runtime: c, Root: &disk.OwnRoot{}, Kubelet: a.kubeletImageFs(ctx)}
	a.disk = &disk.Guard{Reader: figures, Ceiling: disk.Ceiling{Percent: f.diskCeilingPercent}, Log: log}
	cfg := pull.Config{
		Disk:                  a.disk,
		Parallelism:           f.parallelism,
		Policy:                v1alpha1.PullPolicy(f.pullPolicy),
		InitialAttemptTimeout: f.initialAttemptTimeout,
		MaxAttemptTimeout:     f.maxAttemptTimeout,
		InitialDelay:          f.initialDelay,
		MaxDelay:              f.maxDelay,
		OverallTimeout:        f.overallTimeout,
		PermanentAttempts:     f.permanentAttempts,
		Gate:                  gate,
		Creds:                 provider,
		Waiting:               a.onWaiting,
		Hold:                  a.holdGC,
		Log:                   log,
		Sleep:                 deps.Sleep,
	}
	if a.metrics != nil {
		cfg.Observer = a.metrics
		if gate != nil {
			cfg.Gate = a.metrics.Gate(gate)
		}
	}
	cfg.Progress = progressOf(runtimeName, c)
	a.puller = pull.New(statusBound{Runtime: c, timeout: f.statusTimeout}, cfg)
	a.initPins(runtimeName, version, imageFsCapacity(a.disk.Reader))
	return nil
}

// statusBound bounds each ImageStatus call. ImageStatus only reads the
// runtime's metadata, so a call that takes long means a runtime that is
// stuck; the puller then pulls the image rather than wait for good. Pulls
// have deadlines of their own.
type statusBound struct {
	pull.Runtime
	timeout time.Duration
}

func (s statusBound) ImageStatus(ctx context.Context, ref string) (*cri.ImageInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Runtime.ImageStatus(ctx, ref)
}

// loadList parses the list file's text, then the extra images given as
// arguments, in one de-duplication scope, with the function's rules.
func loadList(text string, args []string) imagelist.List {
	var b imagelist.Builder
	b.AddText(text)
	for _, ref := range args {
		b.Add(0, ref)
	}
	return b.List()
}

// runtimeVersion asks the runtime who it is, waiting a little for a
// runtime that is still starting, and returns its name and version.
func (a *agent) runtimeVersion(ctx context.Context) (string, string, error) {
	deadline := time.Now().Add(a.flags.versionRetryFor)
	wait := 200 * time.Millisecond
	for {
		vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		name, ver, err := a.cri.Version(vctx)
		cancel()
		if err == nil {
			a.log.Info("connected to the container runtime", "socket", a.cri.Socket, "runtime", name, "version", ver)
			return name, ver, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return "", "", fmt.Errorf("container runtime at %s does not answer: %w", a.cri.Socket, err)
		}
		a.log.Warn("container runtime not answering yet; retrying", "socket", a.cri.Socket, "err", err)
		if sleepCtx(ctx, wait) != nil {
			return "", "", ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (a *agent) observe(s label.Summary) {
	if a.metrics != nil {
		a.metrics.Checked(s.Present, s.FailureCount(), time.Now())
		fs := make([]metrics.Failure, len(s.Failed))
		for i, f := range s.Failed {
			fs[i] = metrics.Failure{Image: f.Image, Reason: f.Reason}
		}
		a.metrics.Failed(fs)
	}
}
