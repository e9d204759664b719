package cluster

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Runtime is the container runtime a node runs.
type Runtime string

// The runtimes of the matrix (docs/testing.md). Containerd16 is Debian's
// package; the others are built by `make runtimes` and cached by version.
const (
	Containerd16 Runtime = "containerd-1.6"
	Containerd2  Runtime = "containerd-2"
	CRIO         Runtime = "cri-o"
)

// Versions of the runtimes `make runtimes` builds (Makefile
// CONTAINERD_VERSION and CRIO_VERSION).
const (
	Containerd2Version = "v2.4.2"
	CRIOVersion        = "v1.34.0"
)

// Runtimes lists every runtime of the matrix.
var Runtimes = []Runtime{Containerd16, Containerd2, CRIO}

// CRIOSocketPath is CRI-O's socket inside a CRI-O node, its default path
// (what the function renders for `runtime: crio`).
const CRIOSocketPath = "/run/crio/crio.sock"

// DefaultRuntimesDir is where `make runtimes` caches the runtime binaries.
func DefaultRuntimesDir() string {
	if d := os.Getenv("RUNTIMES_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "image-prefetcher", "runtimes")
}

// RuntimeBinary is the path of a built runtime's binary: "containerd" or
// "containerd-shim-runc-v2" of Containerd2, "crio" or "pinns" of CRIO. Containerd16 is found in PATH.
func RuntimeBinary(r Runtime, name string) string {
	switch r {
	case Containerd2:
		return filepath.Join(DefaultRuntimesDir(), "containerd", Containerd2Version, name)
	case CRIO:
		return filepath.Join(DefaultRuntimesDir(), "cri-o", CRIOVersion, name)
	}
	return name
}

// checkRuntime fails with the fix when a runtime's binaries are missing.
func checkRuntime(r Runtime) error {
	var bins []string
	switch r {
	case Containerd16, "":
		return nil
	case Containerd2:
		bins = []string{"containerd", "containerd-shim-runc-v2"}
	case CRIO:
		bins = []string{"crio", "pinns"}
		if _, err := os.Stat("/usr/bin/conmon"); err != nil {
			return fmt.Errorf("/usr/bin/conmon missing: run `make host-deps`")
		}
	default:
		return fmt.Errorf("unknown runtime %q", r)
	}
	for _, b := range bins {
		if p := RuntimeBinary(r, b); !fileExists(p) {
			return fmt.Errorf("%s %s: %s missing: run `make runtimes`", r, b, p)
		}
	}
	return nil
}

// runtimeProcName is the harness's name for the node's runtime process.
func (n *Node) runtimeProcName() string {
	if n.Runtime == CRIO {
		return n.Name + "/crio"
	}
	return n.Name + "/containerd"
}

// runtimeConfig is the node's runtime configuration file and its content.
func (n *Node) runtimeConfig() (string, string) {
	switch n.Runtime {
	case Containerd2:
		return "containerd.toml", n.containerd2Config()
	case CRIO:
		return "crio.conf", n.crioConfig()
	}
	return "containerd.toml", n.containerdConfig()
}

func (n *Node) runtimeProc() *proc {
	p := &proc{name: n.runtimeProcName(), logPath: n.c.path("logs", strings.ReplaceAll(n.runtimeProcName(), "/", "-")+".log")}
	switch n.Runtime {
	case Containerd2:
		p.argv = n.inNode(RuntimeBinary(Containerd2, "containerd"), "--config", filepath.Join(n.Dir, "containerd.toml"))
	case CRIO:
		// The hidden registries flags keep the host's registries.conf and
		// its drop-ins (short-name aliases) out of the test.
		p.argv = n.inNode(RuntimeBinary(CRIO, "crio"), "--config", filepath.Join(n.Dir, "crio.conf"),
			"--config-dir", filepath.Join(n.Dir, "crio.conf.d"),
			"--registries-conf", filepath.Join(n.Dir, "registries.conf"),
			"--registries-conf-dir", filepath.Join(n.Dir, "registries.conf.d"),
			"--log-level", "info")
	default:
		p.argv = n.inNode("containerd", "--config", filepath.Join(n.Dir, "containerd.toml"))
	}
	return p
}

// containerd2Config is containerd.toml for containerd 2.x (config version
// 3): the same node as containerdConfig, with 2.x's plugin names.
func (n *Node) containerd2Config() string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]

[grpc]
  address = %[2]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[3]q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[4]q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %[6]q

[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # The shim of the same release: the one in PATH is Debian's 1.6.
      runtime_path = %[8]q
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "/run/containerd/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %[5]q
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = %[7]q
`, filepath.Join(n.Dir, "containerd"), NodeSocketPath, filepath.Join(n.Dir, "opt"), PauseImage,
		filepath.Join(n.Dir, "cni", "net.d"), filepath.Join(n.Dir, "certs.d"), n.VerifierDir(), RuntimeBinary(Containerd2, "containerd-shim-runc-v2"))
}

// VerifierDir is containerd 2.x's image-verifier bindir: every executable
// put there is asked about each pull (empty: every pull is allowed).
func (n *Node) VerifierDir() string { return filepath.Join(n.Dir, "image-verifiers") }

// crioConfig is crio.conf for a CRI-O node: every path CRI-O writes is the
// node's own, storage is vfs (no overlay-in-overlay surprises), cgroups
// are cgroupfs as the kubelet's, runc is the runtime (crun is not
// installed and a missing default runtime is fatal), and the signature
// policy accepts anything, as a node without policy would.
func (n *Node) crioConfig() string {
	d := filepath.Join(n.Dir, "crio")
	return fmt.Sprintf(`[crio]
root = %[1]q
runroot = %[2]q
storage_driver = "vfs"
log_dir = %[3]q
version_file = %[4]q
version_file_persist = %[5]q
clean_shutdown_file = %[6]q

[crio.api]
listen = %[7]q
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon = "/usr/bin/conmon"
conmon_cgroup = "pod"
namespaces_dir = %[8]q
pinns_path = %[9]q
container_exits_dir = %[10]q
container_attach_socket_dir = %[11]q
hooks_dir = []
seccomp_profile = ""
apparmor_profile = ""
selinux = false

[crio.runtime.runtimes.runc]
runtime_path = %[17]q
runtime_type = "oci"
runtime_root = "/run/crio/runc"
monitor_path = "/usr/bin/conmon"

[crio.image]
pause_image = %[12]q
# The harness's pause image runs its binary from here (tests/cluster/pause.go).
pause_command = "/usr/local/bin/pause"
signature_policy = %[13]q
signature_policy_dir = %[14]q
big_files_temporary_dir = %[15]q

[crio.network]
network_dir = %[16]q
plugin_dirs = ["/usr/lib/cni"]
`, filepath.Join(d, "storage"), filepath.Join(d, "runroot"), filepath.Join(d, "pods"),
		filepath.Join(d, "version"), filepath.Join(d, "version-persist"), filepath.Join(d, "clean.shutdown"),
		n.CRISocket, filepath.Join(d, "ns"), RuntimeBinary(CRIO, "pinns"),
		filepath.Join(d, "exits"), filepath.Join(d, "attach"),
		PauseImage, filepath.Join(n.Dir, "policy.json"), filepath.Join(d, "policies"), filepath.Join(d, "tmp"),
		filepath.Join(n.Dir, "cni", "net.d"), n.runcPath)
}

// crioFiles are the files besides crio.conf a CRI-O node reads. CRI-O
// treats 127.0.0.0/8 registries as insecure by itself; the mirrored hosts
// (ghcr.io, ...) are pointed at the run's registry over plain HTTP, as
// containerd's hosts.toml does.
func (n *Node) crioFiles() map[string]string {
	var reg strings.Builder
	reg.WriteString("unqualified-search-registries = []\nshort-name-mode = \"enforcing\"\n")
	for _, h := range MirroredHosts {
		fmt.Fprintf(&reg, "\n[[registry]]\nprefix = %q\nlocation = %q\ninsecure = true\n", h, h)
	}
	if len(n.ShortNameAliases) > 0 {
		reg.WriteString("\n[aliases]\n")
		for _, k := range sortedKeys(n.ShortNameAliases) {
			fmt.Fprintf(&reg, "%q = %q\n", k, n.ShortNameAliases[k])
		}
	}
	return map[string]string{
		"registries.conf":         reg.String(),
		"registries.conf.d/.keep": "",
		"crio.conf.d/.keep":       "",
		// big_files_temporary_dir must exist.
		"crio/tmp/.keep": "",
		"policy.json":    `{"default": [{"type": "insecureAcceptAnything"}]}` + "\n",
	}
}

// SocketPath is the node's CRI socket as seen inside the node (what the
// kubelet and rendered manifests use).
func (n *Node) SocketPath() string {
	if n.Runtime == CRIO {
		return CRIOSocketPath
	}
	return NodeSocketPath
}

// setSocket sets CRISocket, the socket as the test process sees it.
func (n *Node) setSocket() {
	if n.Runtime == CRIO {
		n.CRISocket = filepath.Join(n.Dir, "crio-run", "crio.sock")
		return
	}
	n.CRISocket = filepath.Join(n.Dir, "run", "containerd.sock")
}

// runtimeLabel names the node's runtime in progress lines.
func (n *Node) runtimeLabel() string {
	switch n.Runtime {
	case Containerd2:
		return "containerd " + Containerd2Version
	case CRIO:
		return "cri-o " + CRIOVersion
	}
	return "containerd"
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
