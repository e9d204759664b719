package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Node is one kubelet with its own container runtime (containerd, or
// CRI-O: Runtime), in its own mount namespace where /run/containerd and
// /run/crio are the node's own directories: a DaemonSet's hostPath
// /run/containerd or /var/run/crio reaches this node's runtime, unchanged.
type Node struct {
	c     *Cluster
	Index int
	// Name is the Node object's name.
	Name string
	// IP is the node's InternalIP inside the network namespace.
	IP string
	// CgroupRoot is the kubelet's cgroupRoot, below every hierarchy.
	CgroupRoot string
	// CRISocket is containerd's socket as seen from the test process; a
	// pod on the node sees it as /run/containerd/containerd.sock.
	CRISocket string
	Labels    map[string]string
	// Dir is the node's state directory (containerd root, kubelet root).
	Dir string
	// Runtime is the node's container runtime; empty is Containerd16.
	Runtime Runtime
	// ShortNameAliases are CRI-O's registries.conf [aliases] (short name
	// to fully qualified repository), for CRIO nodes.
	ShortNameAliases map[string]string
	holderPID        int
	cniNet           string
	// kubeletArgs are extra kubelet flags (see JoinOptions).
	kubeletArgs []string
	// runcPath is the runc CRI-O runs (crioruntime.go).
	runcPath string
	// imageStoreBytes is the size of the runtime root's tmpfs; 0 for none.
	imageStoreBytes int64
}

// NodeSocketPath is the CRI socket path inside every node (what rendered
// manifests use).
const NodeSocketPath = "/run/containerd/containerd.sock"

// NodeName is the name of node i (0-based).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i+1) }

func nodeIP(i int) string { return fmt.Sprintf("10.200.0.%d", 11+i) }

func (n *Node) state() nodeState {
	return nodeState{Name: n.Name, CgroupRoot: n.CgroupRoot, HolderPID: n.holderPID, CRISocket: n.CRISocket, CNINetwork: n.cniNet}
}

// DefaultNodeLabels are node i's labels unless Options.NodeLabels is set.
func DefaultNodeLabels(i int) map[string]string {
	return map[string]string{
		"e2e.image-prefetcher.io/node": NodeName(i),
		"e2e.image-prefetcher.io/pool": "pool-" + string(rune('a'+i%26)),
	}
}

// Nodes returns the cluster's nodes.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes)
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (c *Cluster) startNodes(ctx context.Context) error {
	if err := c.startRegistry(); err != nil {
		return err
	}
	// The pause image and the nodes' containerds do not need the
	// apiserver: prepare them while it starts.
	var wg sync.WaitGroup
	var pauseErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		pauseErr = c.pushPause(ctx)
	}()
	saved, err := saveSysctls(c.opts.BaseDir, c.Dir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.sysctls = saved
	c.mu.Unlock()

	for i := range c.opts.Nodes {
		n := c.newNode(i, nil)
		c.mu.Lock()
		c.nodes = append(c.nodes, n)
		c.mu.Unlock()
		if err := n.prepare(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := n.startContainerd(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if err := c.WaitAPIServer(ctx); err != nil {
		return err
	}
	if err := c.startControllers(ctx); err != nil {
		return err
	}
	wg.Wait()
	if pauseErr != nil {
		return pauseErr
	}
	for _, n := range c.nodes {
		if err := n.waitContainerd(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := n.startKubelet(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return c.WaitNodesReady(ctx)
}

// newNode describes node i; extra labels are added to its defaults.
func (c *Cluster) newNode(i int, extra map[string]string) *Node {
	labels := DefaultNodeLabels(i)
	if c.opts.NodeLabels != nil {
		maps.Copy(labels, c.opts.NodeLabels(i))
	}
	maps.Copy(labels, extra)
	n := &Node{
		c: c, Index: i, Name: NodeName(i), IP: nodeIP(i),
		CgroupRoot: fmt.Sprintf("/ipf-%s-%s", c.ID, NodeName(i)),
		Labels:     labels,
		Dir:        c.path(fmt.Sprintf("n%d", i+1)),
		cniNet:     fmt.Sprintf("ipf-%s-n%d", c.ID, i+1),
	}
	if c.opts.NodeRuntime != nil {
		n.Runtime = c.opts.NodeRuntime(i)
	}
	n.ShortNameAliases = c.opts.ShortNameAliases
	n.imageStoreBytes = c.opts.ImageStoreBytes
	n.setSocket()
	return n
}

func (c *Cluster) startControllers(ctx context.Context) error {
	// Pods reach the apiserver at the kubernetes Service address without
	// kube-proxy: one DNAT rule for traffic from pods and from the host.
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		if err := run(ctx, "nsenter", "--net="+c.NetNS.Path, "iptables", "-w", "-t", "nat", "-A", chain,
			"-d", ServiceIP+"/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", controlPlaneIP+":"+apiPort); err != nil {
			return fmt.Errorf("add service DNAT rule: %w", err)
		}
	}
	cm := c.kubeconfigFor("system:kube-controller-manager")
	p := &proc{
		name: "kube-controller-manager",
		argv: c.inNS(c.kubeBin("kube-controller-manager"),
			"--kubeconfig="+cm, "--authentication-kubeconfig="+cm, "--authorization-kubeconfig="+cm,
			"--service-account-private-key-file="+c.pki.SAKey,
			"--root-ca-file="+c.pki.CACert,
			"--use-service-account-credentials=true",
			"--controllers=*",
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--cert-dir="+c.path("pki", "controller-manager"),
			"-v=1",
		),
		logPath: c.path("logs", "kube-controller-manager.log"),
	}
	if err := c.addProc(p); err != nil {
		return err
	}
	sc := c.kubeconfigFor("system:kube-scheduler")
	p = &proc{
		name: "kube-scheduler",
		argv: c.inNS(c.kubeBin("kube-scheduler"),
			"--kubeconfig="+sc, "--authentication-kubeconfig="+sc, "--authorization-kubeconfig="+sc,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--cert-dir="+c.path("pki", "scheduler"),
			"-v=1",
		),
		logPath: c.path("logs", "kube-scheduler.log"),
	}
	if err := c.addProc(p); err != nil {
		return err
	}
	c.progress("kube-controller-manager and kube-scheduler started")
	return nil
}

// prepare writes the node's configuration, creates its cgroups and starts
// the process that holds its mount namespace.
func (n *Node) prepare(ctx context.Context) error {
	for _, d := range []string{"run", "crio-run", "containerd", "opt", "kubelet", "pod-logs", "varlog", "varlib", "cni/net.d", "cni/ipam", "certs.d", "image-verifiers"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := n.createCgroups(); err != nil {
		return err
	}
	if n.Runtime == CRIO {
		p, err := RuncNoHugetlb(ctx)
		if err != nil {
			return err
		}
		n.runcPath = p
	}
	cfgName, cfg := n.runtimeConfig()
	auth, err := n.kubeletAuth()
	if err != nil {
		return err
	}
	kubelet, err := withFields(n.kubeletConfig(), auth)
	if err == nil {
		kubelet, err = withFields(kubelet, n.c.opts.KubeletConfig)
	}
	if err == nil && n.c.opts.NodeKubeletConfig != nil {
		kubelet, err = withFields(kubelet, n.c.opts.NodeKubeletConfig(n.Index))
	}
	if err != nil {
		return fmt.Errorf("kubelet config: %w", err)
	}
	files := map[string]string{
		cfgName:                        cfg,
		"kubelet.yaml":                 kubelet,
		"cni/net.d/10-bridge.conflist": n.cniConfig(),
		"hosts":                        n.hostsFile(),
		"certs.d/" + RegistryAddr + "/hosts.toml": hostsToml(RegistryAddr),
	}
	for _, h := range MirroredHosts {
		files["certs.d/"+h+"/hosts.toml"] = hostsToml(h)
	}
	if n.Runtime == CRIO {
		maps.Copy(files, n.crioFiles())
	}
	for name, content := range files {
		p := filepath.Join(n.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("create dir for %s: %w", name, err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	if err := n.c.writeKubeconfig(filepath.Join(n.Dir, "kubelet.kubeconfig"), "system:node:"+n.Name, "https://127.0.0.1:"+apiPort); err != nil {
		return err
	}
	return n.startHolder(ctx)
}

// holderScript builds the node's private mount namespace: /run becomes a
// tmpfs that maps back every entry of the real /run except containerd and
// crio, which are the node's own directories; /var/log and /var/lib are the node's
// own, so the kubelet's /var/log/containers links and the CNI library's
// /var/lib/cni cache stay in the run directory; /etc/hosts points the
// mirrored registry names at the run's registry.
func (n *Node) holderScript() string {
	return fmt.Sprintf(`set -e
N=%q
# mount(8) would otherwise create /run/mount for its utab on the host.
export LIBMOUNT_UTAB="$N/utab"
mkdir -p "$N/hostrun"
mount --bind /run "$N/hostrun"
mount -t tmpfs -o mode=755 tmpfs /run
for e in "$N"/hostrun/* "$N"/hostrun/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  b=${e##*/}
  [ "$b" = containerd ] || [ "$b" = crio ] && continue
  if [ -L "$e" ]; then cp -P "$e" "/run/$b"
  elif [ -d "$e" ]; then mkdir -p "/run/$b"; mount --rbind "$e" "/run/$b"
  else [ -e "/run/$b" ] || : > "/run/$b"; mount --bind "$e" "/run/$b"
  fi
done
mkdir /run/containerd /run/crio
mount --bind "$N/run" /run/containerd
mount --bind "$N/crio-run" /run/crio
umount -l "$N/hostrun"
mount --bind "$N/varlog" /var/log
mount --bind "$N/varlib" /var/lib
mount --bind "$N/hosts" /etc/hosts
%s
: > "$N/holder.ready"
exec sleep infinity
`, n.Dir, n.imageStoreMount())
}

func (n *Node) startHolder(ctx context.Context) error {
	c := n.c
	p := &proc{
		name:    n.Name + "/holder",
		argv:    c.inNS("unshare", "--mount", "--propagation", "private", "sh", "-c", n.holderScript()),
		logPath: c.path("logs", n.Name+"-holder.log"),
	}
	if err := c.addProc(p); err != nil {
		return err
	}
	ready := filepath.Join(n.Dir, "holder.ready")
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := waitFor(wctx, n.Name+" mount namespace", []*proc{p}, func(context.Context) bool {
		_, err := os.Stat(ready)
		return err == nil
	}); err != nil {
		return err
	}
	n.holderPID = p.pid()
	return c.writeState()
}

// inNode prefixes a command so that it runs in the node's mount namespace
// and the run's network namespace.
func (n *Node) inNode(argv ...string) []string {
	return append([]string{"nsenter", fmt.Sprintf("--target=%d", n.holderPID), "--mount", "--net", "--"}, argv...)
}

// Command prepares a command that runs inside the node: its mount
// namespace (so /run/containerd is this node's) and the network namespace.
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := n.inNode(append([]string{n.c.resolve(name)}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+n.c.Kubeconfig)
	return cmd
}

func (n *Node) createCgroups() error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, n.CgroupRoot)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" {
			// A v1 cpuset cgroup takes no tasks until it has cpus and mems.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return fmt.Errorf("read %s: %w", f, err)
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("write %s: %w", f, err)
				}
			}
		}
	}
	return nil
}

func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[2]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[3]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "/run/containerd/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[5]q
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[6]q
`, filepath.Join(n.Dir, "containerd"), NodeSocketPath, filepath.Join(n.Dir, "opt"), PauseImage,
		filepath.Join(n.Dir, "cni", "net.d"), filepath.Join(n.Dir, "certs.d"))
}

// hostsToml sends every pull for host to http://host, which the node's
// /etc/hosts points at the run's registry. containerd 1.6 rejects a
// hosts.toml without a host table ("invalid `host` tree") and falls back to
// https; a push-only entry satisfies it without adding a second pull
// attempt per request, so one failed pull is one registry request.
func hostsToml(host string) string {
	return fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"push\"]\n", host)
}

func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni%d",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.%d.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.cniNet, n.Index+1, n.Index+1, filepath.Join(n.Dir, "cni", "ipam"))
}

func (n *Node) hostsFile() string {
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n::1 localhost\n")
	fmt.Fprintf(&b, "127.0.0.1 %s\n", strings.Join(MirroredHosts, " "))
	fmt.Fprintf(&b, "%s %s\n", n.IP, n.Name)
	return b.String()
}

func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %q
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %q
volumePluginDir: %q
address: %s
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
oomScoreAdj: 0
protectKernelDefaults: false
serializeImagePulls: false
evictionHard:
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.inodesFree: "1%%"
nodeStatusUpdateFrequency: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, n.CgroupRoot, n.SocketPath(), filepath.Join(n.Dir, "pod-logs"), filepath.Join(n.Dir, "volume-plugins"), n.IP)
}

func (n *Node) startContainerd(ctx context.Context) error {
	p := n.runtimeProc()
	if err := n.c.addProc(p); err != nil {
		return err
	}
	n.c.progress("%s: %s started (pid %d)", n.Name, n.runtimeLabel(), p.pid())
	return nil
}

// waitContainerd waits until the CRI answers Version.
func (n *Node) waitContainerd(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return waitFor(wctx, n.Name+" "+n.runtimeLabel()+" CRI", []*proc{n.c.proc(n.runtimeProcName())}, func(ctx context.Context) bool {
		cri, err := n.CRI()
		if err != nil {
			return false
		}
		defer cri.Close()
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		_, err = cri.Runtime.Version(rctx, &runtimeapi.VersionRequest{})
		return err == nil
	})
}

// RestartContainerd stops the node's containerd (SIGTERM; running
// containers survive, as on a real node) and starts it again.
func (n *Node) RestartContainerd(ctx context.Context) error {
	if err := n.StopContainerd(ctx); err != nil {
		return err
	}
	return n.StartContainerd(ctx)
}

// StopContainerd stops the node's runtime (containerd, or CRI-O on a CRIO
// node; the name predates CRI-O nodes).
func (n *Node) StopContainerd(ctx context.Context) error {
	p := n.c.proc(n.runtimeProcName())
	if p == nil {
		return errors.New("containerd was never started")
	}
	p.stop(10 * time.Second)
	n.c.progress("%s: %s stopped", n.Name, n.runtimeLabel())
	return nil
}

// StartContainerd starts the node's containerd after StopContainerd and
// waits until its CRI answers.
func (n *Node) StartContainerd(ctx context.Context) error {
	if p := n.c.proc(n.runtimeProcName()); p != nil {
		if done, _ := p.exited(); !done {
			return errors.New("containerd is already running")
		}
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	return n.waitContainerd(ctx)
}

func (n *Node) startKubelet(ctx context.Context) error {
	keys := slices.Sorted(maps.Keys(n.Labels))
	var labels []string
	for _, k := range keys {
		labels = append(labels, k+"="+n.Labels[k])
	}
	args := []string{
		"--config=" + filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(n.Dir, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(n.Dir, "kubelet"),
		"--cert-dir=" + filepath.Join(n.Dir, "kubelet", "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		"--node-labels=" + strings.Join(labels, ","),
		"-v=1",
	}
	p := &proc{
		name:    n.Name + "/kubelet",
		argv:    n.inNode(append([]string{n.c.kubeBin("kubelet")}, append(args, n.kubeletArgs...)...)...),
		logPath: n.c.path("logs", n.Name+"-kubelet.log"),
	}
	if err := n.c.addProc(p); err != nil {
		return err
	}
	n.c.progress("%s: kubelet started (pid %d)", n.Name, p.pid())
	return nil
}

// WaitNodesReady waits until every node reports Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	var watch []*proc
	for _, n := range c.Nodes() {
		watch = append(watch, c.proc(n.Name+"/kubelet"), c.proc(n.runtimeProcName()))
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	last := ""
	err = waitFor(wctx, "nodes Ready", watch, func(ctx context.Context) bool {
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		var ready []string
		for _, node := range list.Items {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready = append(ready, node.Name)
				}
			}
		}
		sort.Strings(ready)
		if s := strings.Join(ready, ","); s != last {
			last = s
			c.progress("nodes Ready: %d/%d %v", len(ready), len(c.Nodes()), ready)
		}
		return len(ready) == len(c.Nodes())
	})
	return err
}

// CRIClient is a CRI connection to one node's containerd.
type CRIClient struct {
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
	conn    *grpc.ClientConn
}

// Close closes the connection.
func (c *CRIClient) Close() error { return c.conn.Close() }

// CRI connects to the node's containerd from the test process.
func (n *Node) CRI() (*CRIClient, error) {
	conn, err := grpc.NewClient("unix://"+n.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s CRI at %s: %w", n.Name, n.CRISocket, err)
	}
	return &CRIClient{Runtime: runtimeapi.NewRuntimeServiceClient(conn), Images: runtimeapi.NewImageServiceClient(conn), conn: conn}, nil
}

// removePods stops and removes every pod sandbox through the CRI, so that
// containerd releases their network (CNI DEL), mounts and cgroups the
// regular way before it is stopped.
func (n *Node) removePods(ctx context.Context) error {
	p := n.c.proc(n.runtimeProcName())
	if p == nil {
		return nil
	}
	if done, _ := p.exited(); done {
		return nil
	}
	cri, err := n.CRI()
	if err != nil {
		return err
	}
	defer cri.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	list, err := cri.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("%s: list pods: %w", n.Name, err)
	}
	// The containers are killed first: a sandbox's stop otherwise gives
	// each container its stop timeout, which CRI-O waits out (23 s of a
	// one-node teardown, while an agent finished its shutdown).
	ctrs, err := cri.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return fmt.Errorf("%s: list containers: %w", n.Name, err)
	}
	var errs []error
	for _, ctr := range ctrs.Containers {
		if ctr.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			continue
		}
		if _, err := cri.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ctr.Id, Timeout: 0}); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop container %s: %w", n.Name, ctr.Metadata.GetName(), err))
		}
	}
	for _, sb := range list.Items {
		if _, err := cri.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop pod %s: %w", n.Name, sb.Metadata.GetName(), err))
			continue
		}
		if _, err := cri.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("%s: remove pod %s: %w", n.Name, sb.Metadata.GetName(), err))
		}
	}
	return errors.Join(errs...)
}
