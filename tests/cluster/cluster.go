// Package cluster starts and stops a real Kubernetes cluster on this machine
// for tests: etcd, kube-apiserver and, unless only the control plane is
// asked for, kube-controller-manager, kube-scheduler and several nodes, each
// a kubelet with its own containerd. Everything runs in a network namespace
// made for the run, so ports never collide and no traffic leaves it; the
// test process reaches the cluster through sockets created inside that
// namespace.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// KubeVersion is the Kubernetes version the harness runs (see `make kube`).
const KubeVersion = "v1.36.3"

// Addresses inside the run's network namespace.
const (
	controlPlaneIP = "10.200.0.1"
	apiPort        = "6443"
	// ServiceIP is the kubernetes.default Service address pods use.
	ServiceIP = "10.96.0.1"
	// RegistryAddr is where the registry listens inside the namespace;
	// images pushed as RegistryAddr/<repo>:<tag> are pulled by pods as
	// ghcr.io/<repo>:<tag> (or any host in MirroredHosts).
	RegistryAddr = "127.0.0.1:5000"
)

// MirroredHosts are registry hosts that every node's containerd resolves to
// the run's registry. Pull them by their real names in manifests.
var MirroredHosts = []string{"ghcr.io", "docker.io", "registry-1.docker.io", "quay.io", "registry.k8s.io", "gcr.io"}

// PauseImage is the sandbox image; it is built from a tiny static binary
// and pushed to the registry at start.
const PauseImage = "registry.k8s.io/pause:3.10"

// Options select what Start brings up.
type Options struct {
	// Deploys says the tests render and deploy with ./bin (kustomize, the
	// function, the agent): RunMain checks them first, so that a missing
	// build fails in a second, not after minutes.
	Deploys bool
	// Nodes is the number of nodes. Zero means control plane only: etcd
	// and kube-apiserver, ready in a few seconds, for server-side dry runs
	// and API tests that need no kubelet.
	Nodes int
	// NodeLabels gives node i (0-based) extra labels. By default node i is
	// labeled e2e.image-prefetcher.io/node=node-<i+1> and
	// e2e.image-prefetcher.io/pool=pool-<a|b|...>.
	NodeLabels func(i int) map[string]string
	// LateNodes is how many nodes AddNode may join after start. Their
	// credentials and addresses are made at start: the apiserver reads its
	// token file only once.
	LateNodes int
	// NodeRuntime gives node i's container runtime; by default every node
	// runs Containerd16.
	NodeRuntime func(i int) Runtime
	// ShortNameAliases are the registries.conf [aliases] of CRI-O nodes
	// (short name to fully qualified repository).
	ShortNameAliases map[string]string
	// KubeletConfig replaces top-level fields of every node's
	// KubeletConfiguration, e.g. imageMinimumGCAge or evictionHard: the
	// harness's kubelets never garbage-collect images otherwise.
	KubeletConfig map[string]any
	// NodeKubeletConfig, when set, replaces top-level fields of node i's
	// KubeletConfiguration after KubeletConfig: kubelets set up unlike
	// each other in one cluster, e.g. imagePullCredentialsVerificationPolicy.
	NodeKubeletConfig func(i int) map[string]any
	// ImageStoreBytes, when set, makes each node's image store (its
	// runtime's root directory) a tmpfs of that size, inside the node's
	// mount namespace: a small image filesystem of the node's own, which
	// the kubelet's image GC and eviction see as the imagefs.
	ImageStoreBytes int64
	// KubeletAuth makes the kubelets authenticate and authorize requests
	// through the apiserver (webhook), as kubeadm's do, and serve a
	// certificate the cluster CA signed for their IP, as with
	// serverTLSBootstrap (kubeletauth.go).
	KubeletAuth bool
	// BaseDir holds one directory per run. Default $IMAGE_PREFETCHER_E2E_DIR
	// or /tmp/ipf-e2e.
	BaseDir string
	// KubeBinDir holds the Kubernetes binaries. Default $KUBE_BIN_DIR or
	// ~/.cache/image-prefetcher/kube/<KubeVersion>.
	KubeBinDir string
	// Progress receives one line per start-up step. Default os.Stderr.
	Progress io.Writer
	// Detached leaves components running if this process dies (the CLI's
	// `up`). Tests leave it false so that a crashed test kills the
	// components with it.
	Detached bool
}

// Cluster is a running cluster. All methods are safe for concurrent use.
type Cluster struct {
	opts Options
	ID   string
	// Dir is the run's state directory; logs are in Dir/logs.
	Dir   string
	NetNS *NetNS
	// Kubeconfig is an admin kubeconfig, usable with Exec (inside the
	// namespace) or with RESTConfig's dialer.
	Kubeconfig string

	pki      *pki
	tokens   map[string]string
	mu       sync.Mutex
	procs    map[string]*proc
	nodes    []*Node
	registry *registry.Registry
	regStop  func()
	sysctls  *sysctlSaver
	started  time.Time
	attached bool
	// agent is the agent image AgentImage pushed, once.
	agent struct {
		once sync.Once
		ref  string
		err  error
	}
}

// Start brings up a cluster and returns when it is ready: the apiserver
// answers /readyz and, with nodes, every node is Ready. On error everything
// already started is torn down.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	if opts.BaseDir == "" {
		opts.BaseDir = defaultBaseDir()
	}
	if opts.KubeBinDir == "" {
		opts.KubeBinDir = DefaultKubeBinDir()
	}
	if err := preflight(opts); err != nil {
		return nil, err
	}
	cleaned, err := CleanStale(ctx, opts.BaseDir)
	if len(cleaned) > 0 {
		fmt.Fprintf(opts.Progress, ">> cluster: removed runs left by crashed owners: %v\n", cleaned)
	}
	if err != nil {
		// Not this run's problem; `cluster down -all` retries.
		fmt.Fprintf(opts.Progress, ">> cluster: warning: %v\n", err)
	}
	var dir string
	// Another run's teardown removes the base directory when it is empty;
	// try again if that happens between the two calls.
	for attempt := 0; ; attempt++ {
		if err = os.MkdirAll(opts.BaseDir, 0o755); err == nil {
			if dir, err = os.MkdirTemp(opts.BaseDir, "r"); err == nil {
				break
			}
		}
		if attempt == 3 {
			return nil, fmt.Errorf("create run directory under %s: %w", opts.BaseDir, err)
		}
	}
	if err := checkRoom(dir); err != nil {
		_ = os.Remove(dir)
		return nil, err
	}
	c := &Cluster{
		opts:    opts,
		ID:      filepath.Base(dir),
		Dir:     dir,
		procs:   map[string]*proc{},
		started: time.Now(),
	}
	c.progress("run %s in %s", c.ID, dir)
	if err := c.start(ctx); err != nil {
		c.progress("start failed, tearing down: %v", err)
		if derr := c.Stop(context.WithoutCancel(ctx)); derr != nil {
			err = errors.Join(err, fmt.Errorf("teardown after failed start: %w", derr))
		}
		return nil, err
	}
	c.progress("cluster ready (%d node(s))", len(c.nodes))
	return c, nil
}

// DefaultKubeBinDir is where `make kube` caches the Kubernetes binaries.
func DefaultKubeBinDir() string {
	if d := os.Getenv("KUBE_BIN_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "image-prefetcher", "kube", KubeVersion)
}

func preflight(opts Options) error {
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		if opts.Nodes == 0 && b != "kube-apiserver" {
			continue
		}
		if _, err := os.Stat(filepath.Join(opts.KubeBinDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s (not in %s: run `make kube`)", b, opts.KubeBinDir))
		}
	}
	tools := []string{"etcd", "nsenter", "unshare", "ip"}
	if opts.Nodes > 0 {
		tools = append(tools, "containerd", "containerd-shim-runc-v2", "runc", "iptables", "mount")
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, fmt.Sprintf("%s (not in PATH: run `make host-deps`)", t))
		}
	}
	for i := range opts.Nodes {
		if opts.NodeRuntime != nil {
			if err := checkRuntime(opts.NodeRuntime(i)); err != nil {
				missing = append(missing, err.Error())
			}
		}
	}
	if opts.Nodes > 0 {
		if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
			missing = append(missing, "/usr/lib/cni/bridge (run `make host-deps`)")
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root privileges (namespaces, mounts and cgroups need root)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("cannot start a cluster, missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

func (c *Cluster) progress(format string, args ...any) {
	fmt.Fprintf(c.opts.Progress, ">> cluster %s [%5.1fs] %s\n", c.ID, time.Since(c.started).Seconds(), fmt.Sprintf(format, args...))
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.Dir}, elem...)...)
}

func (c *Cluster) start(ctx context.Context) error {
	for _, d := range []string{"logs", "pki", "etcd", "kube"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := c.writeState(); err != nil {
		return err
	}
	addrs := []string{controlPlaneIP}
	for i := range c.opts.Nodes + c.opts.LateNodes {
		addrs = append(addrs, nodeIP(i))
	}
	ns, err := createNetNS(ctx, c.path("netns"), addrs)
	c.NetNS = ns
	if err != nil {
		return err
	}
	c.progress("network namespace %s ready", ns.Path)

	if err := c.writeControlPlaneFiles(); err != nil {
		return err
	}
	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	if c.opts.Nodes == 0 {
		return c.WaitAPIServer(ctx)
	}
	return c.startNodes(ctx)
}

func (c *Cluster) addProc(p *proc) error {
	c.mu.Lock()
	c.procs[p.name] = p
	c.mu.Unlock()
	if err := p.start(!c.opts.Detached); err != nil {
		return err
	}
	return c.writeState()
}

func (c *Cluster) proc(name string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

// inNS prefixes a command so that it runs in the run's network namespace.
func (c *Cluster) inNS(argv ...string) []string {
	return append([]string{"nsenter", "--net=" + c.NetNS.Path, "--"}, argv...)
}

func (c *Cluster) kubeBin(name string) string { return filepath.Join(c.opts.KubeBinDir, name) }

// Static bearer tokens: the control plane's own users and the admin.
func (c *Cluster) writeControlPlaneFiles() error {
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(ServiceIP), net.ParseIP(controlPlaneIP)}
	p, err := writePKI(c.path("pki"), ips, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	c.pki = p
	if err := c.writeKubeletClientCert(); err != nil {
		return err
	}
	users := [][2]string{
		{"admin", "system:masters"},
		{"system:kube-controller-manager", ""},
		{"system:kube-scheduler", ""},
	}
	for i := range c.opts.Nodes + c.opts.LateNodes {
		users = append(users, [2]string{"system:node:" + NodeName(i), "system:nodes"})
	}
	c.tokens = map[string]string{}
	var csv strings.Builder
	for _, u := range users {
		tok := randHex(16)
		c.tokens[u[0]] = tok
		fmt.Fprintf(&csv, "%s,%s,%s", tok, u[0], u[0])
		if u[1] != "" {
			fmt.Fprintf(&csv, ",%q", u[1])
		}
		csv.WriteString("\n")
	}
	if err := os.WriteFile(c.path("pki", "tokens.csv"), []byte(csv.String()), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	c.Kubeconfig = c.path("kube", "admin.kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, "admin", "https://127.0.0.1:"+apiPort); err != nil {
		return err
	}
	for _, u := range []string{"system:kube-controller-manager", "system:kube-scheduler"} {
		if err := c.writeKubeconfig(c.kubeconfigFor(u), u, "https://127.0.0.1:"+apiPort); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) kubeconfigFor(user string) string {
	return c.path("kube", strings.NewReplacer(":", "-").Replace(user)+".kubeconfig")
}

func (c *Cluster) writeKubeconfig(path, user, server string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.pki.CAPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: c.tokens[user]}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	p := &proc{
		name: "etcd",
		argv: c.inNS("etcd",
			"--name=default",
			"--data-dir="+c.path("etcd"),
			"--listen-client-urls=http://127.0.0.1:2379",
			"--advertise-client-urls=http://127.0.0.1:2379",
			"--listen-peer-urls=http://127.0.0.1:2380",
			"--initial-advertise-peer-urls=http://127.0.0.1:2380",
			"--initial-cluster=default=http://127.0.0.1:2380",
			"--unsafe-no-fsync",
			"--log-level=warn",
		),
		logPath: c.path("logs", "etcd.log"),
	}
	if err := c.addProc(p); err != nil {
		return err
	}
	c.progress("etcd started (pid %d)", p.pid())
	return nil
}

func (c *Cluster) apiServerArgs() []string {
	return append(c.inNS(c.kubeBin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0",
		"--secure-port="+apiPort,
		"--advertise-address="+controlPlaneIP,
		"--cert-dir="+c.path("pki", "apiserver"),
		"--tls-cert-file="+c.pki.APICert,
		"--tls-private-key-file="+c.pki.APIKey,
		"--client-ca-file="+c.pki.CACert,
		"--token-auth-file="+c.path("pki", "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+c.pki.SAPub,
		"--service-account-signing-key-file="+c.pki.SAKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
		"-v=1",
	), c.apiServerKubeletArgs()...)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := &proc{name: "kube-apiserver", argv: c.apiServerArgs(), logPath: c.path("logs", "kube-apiserver.log")}
	if err := c.addProc(p); err != nil {
		return err
	}
	c.progress("kube-apiserver started (pid %d), waiting for /readyz", p.pid())
	return nil
}

// WaitAPIServer waits until the apiserver answers /readyz with ok.
func (c *Cluster) WaitAPIServer(ctx context.Context) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	watch := []*proc{c.proc("kube-apiserver")}
	if p := c.proc("etcd"); p != nil {
		watch = append(watch, p)
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	err = waitFor(ctx, "kube-apiserver /readyz", watch, func(ctx context.Context) bool {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		return err == nil && string(body) == "ok"
	})
	if err != nil {
		return err
	}
	c.progress("kube-apiserver ready")
	return nil
}

// StopAPIServer stops kube-apiserver (etcd keeps running), for tests of
// what clients do while it is away.
func (c *Cluster) StopAPIServer(ctx context.Context) error {
	p := c.proc("kube-apiserver")
	if p == nil {
		return errors.New("kube-apiserver is not running")
	}
	p.stop(10 * time.Second)
	c.progress("kube-apiserver stopped")
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer and waits
// until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if p := c.proc("kube-apiserver"); p != nil {
		if done, _ := p.exited(); !done {
			return errors.New("kube-apiserver is already running")
		}
	}
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	return c.WaitAPIServer(ctx)
}

// RESTConfig returns an admin client configuration that works from the test
// process: its connections are made inside the run's network namespace.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	return c.RESTConfigForToken("")
}

// RESTConfigForToken is RESTConfig authenticating with another bearer
// token, for example a service account's (empty keeps the admin's).
func (c *Cluster) RESTConfigForToken(token string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load admin kubeconfig: %w", err)
	}
	if token != "" {
		cfg.BearerToken = token
	}
	cfg.Dial = c.NetNS.DialContext
	cfg.QPS, cfg.Burst = 100, 200
	return cfg, nil
}

// Clientset returns an admin clientset; see RESTConfig.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create clientset: %w", err)
	}
	return cs, nil
}

// Command prepares a command that runs inside the run's network namespace
// with KUBECONFIG set to the admin kubeconfig, for kubectl, kustomize or the
// project's own binaries.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.NetNS.Path, "--", c.resolve(name)}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	return cmd
}

// resolve prefers the kubectl `make kube` built (same version as the
// cluster) over whatever kubectl is in PATH.
func (c *Cluster) resolve(name string) string {
	if name != "kubectl" {
		return name
	}
	dir := c.opts.KubeBinDir
	if dir == "" {
		dir = DefaultKubeBinDir()
	}
	if p := filepath.Join(dir, "kubectl"); fileExists(p) {
		return p
	}
	return name
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Env is the environment a shell needs to use this cluster through Exec or
// `cluster exec`.
func (c *Cluster) Env() []string {
	return []string{"KUBECONFIG=" + c.Kubeconfig, "IMAGE_PREFETCHER_E2E_NETNS=" + c.NetNS.Path}
}

// CreateNamespace creates a namespace and waits for its default
// ServiceAccount, without which pods are refused. It returns the name.
func (c *Cluster) CreateNamespace(ctx context.Context, name string) (string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create namespace %s: %w", name, err)
	}
	if c.proc("kube-controller-manager") == nil {
		return name, nil // nothing creates service accounts without it
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return name, waitFor(wctx, "default ServiceAccount in "+name, nil, func(ctx context.Context) bool {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

// WaitPodsRunning waits until exactly want pods match selector in
// namespace and all of them are Running and Ready, and returns them.
func (c *Cluster) WaitPodsRunning(ctx context.Context, namespace, selector string, want int) ([]corev1.Pod, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var pods []corev1.Pod
	last := ""
	err = waitFor(wctx, fmt.Sprintf("%d running pods %q in %s", want, selector, namespace), nil, func(ctx context.Context) bool {
		list, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false
		}
		ready := 0
		var states []string
		for _, p := range list.Items {
			ok := p.Status.Phase == corev1.PodRunning
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status != corev1.ConditionTrue {
					ok = false
				}
			}
			if ok {
				ready++
			}
			states = append(states, p.Name+"="+string(p.Status.Phase))
		}
		if s := strings.Join(states, " "); s != last {
			last = s
			c.progress("pods %q in %s: %s", selector, namespace, s)
		}
		pods = list.Items
		return ready == want && len(list.Items) == want
	})
	if err != nil {
		return nil, fmt.Errorf("%w; pods: %s", err, last)
	}
	return pods, nil
}
