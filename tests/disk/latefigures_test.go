package disk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// lateWindow is how long the kubelet's stats answer 500 from the first
// request: a kubelet just booted does so for a few seconds, while fetch
// pulls the whole list (issue 48).
const lateWindow = 30 * time.Second

// fetchGID marks fetch's connections, so that one iptables rule sends
// those to the kubelet, and no one else's, through lateKubelet.
const fetchGID = 4242

// TestLateKubeletFigures runs fetch where only the kubelet can give the
// node figures: a process on the host, whose root is not a snapshot on
// the image store (as with devmapper, gVisor or Kata), against the node's
// real containerd, with a CA-signed kubelet (Options.KubeletAuth). The
// kubelet's /stats/summary answers 500 for the first 30 s of the run.
// The list takes 160 MiB once unpacked, more than the 128 MiB store. No
// pull starts before the figures come, the store never reaches the 80%
// ceiling, and the images that do not fit fail InsufficientDisk. Before
// issue 48, the first failed read switched the ceiling off; after that
// fix, pulls started on one kubelet reading (they come every 2 s) all
// counted the same free bytes: 14 of these images took the store to 88%.
// fetch runs with the admin's kubeconfig; the kubelet's stand-in calls
// the kubelet with the admin's client certificate.
func TestLateKubeletFigures(t *testing.T) {
	const instance = "late"
	n := c.Nodes()[0]
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("late-%d", i))
	}
	refs := c.PushData(t, 700, 4<<20, names...)
	kubelet := startLateKubelet(t, n)
	_, before, err := n.ImageStoreUsage()
	if err != nil {
		t.Fatal(err)
	}
	stop := n.PeakImageStoreUse()
	limit := uint64(storeBytes) / 100 * 80

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.Command(ctx, filepath.Join(bin, "image-prefetcher"), append([]string{"fetch",
		"--kubeconfig=" + c.Kubeconfig, "--cri-socket=" + n.CRISocket, "--node-name=" + n.Name,
		"--instance=" + instance}, refs...)...)
	cmd.Env = append(cmd.Env, "POD_NAME=image-prefetcher-late-x7k2p", "POD_NAMESPACE=default",
		"POD_UID=0b5d9f4e-1c2a-4f5e-9d3b-7a8c6e2f1d01")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: fetchGID}}
	var logs cluster.Output
	cmd.Stdout, cmd.Stderr = &logs, &logs
	t.Cleanup(func() { removeLabel(t, instance) })
	err = cmd.Run()
	peak := stop()
	if err != nil {
		t.Fatalf("fetch: %v\n%s", err, logs.String())
	}

	first, firstOK, failed, usedAtOK := kubelet.record()
	t.Logf("the kubelet answered 500 %d times, then its figures %s after the first request; store use %.1f MiB before fetch, %.1f MiB when the figures came, peak %.1f MiB of the %.1f MiB ceiling",
		failed, firstOK.Sub(first).Round(100*time.Millisecond), mib(before), mib(usedAtOK), mib(peak), mib(limit))
	if failed == 0 || firstOK.Sub(first) < lateWindow {
		t.Fatalf("the kubelet answered 500 %d times, its figures came %s after the first request: the run was not exercised\n%s",
			failed, firstOK.Sub(first), logs.String())
	}
	if usedAtOK > before+1<<20 {
		t.Errorf("the store grew from %.1f to %.1f MiB before the figures came: pulls started without a ceiling", mib(before), mib(usedAtOK))
	}
	if peak >= limit {
		t.Errorf("the store reached %d bytes, at or above the ceiling of %d", peak, limit)
	}
	node := waitNode(t, "labeled InsufficientDisk", time.Minute, labeled(instance, "failed", "InsufficientDisk"))
	s := summary(t, node, instance)
	t.Logf("%d of %d images present", s.Present, s.Total)
	if s.Present == 0 {
		t.Error("no image is there: the pulls stopped long before the ceiling")
	}
	for _, f := range s.Failed {
		if f.Reason != "InsufficientDisk" {
			t.Errorf("%s: %s, want InsufficientDisk: %s", f.Image, f.Reason, f.Message)
		}
	}
	if t.Failed() {
		t.Logf("fetch's log:\n%s", logs.String())
	}
	removeAll(t, refs)
}

// lateKubelet stands in for a kubelet that has just booted: for
// lateWindow from the first stats request, /stats/summary answers 500;
// after that, and for every other path, it passes the request on to the
// real kubelet. It serves the kubelet's own certificate.
type lateKubelet struct {
	n     *cluster.Node
	proxy *httputil.ReverseProxy

	mu       sync.Mutex
	first    time.Time // the first stats request
	firstOK  time.Time // the first passed on
	failed   int
	usedAtOK uint64 // the store's use then
}

func (k *lateKubelet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/stats/summary" {
		k.mu.Lock()
		now := time.Now()
		if k.first.IsZero() {
			k.first = now
		}
		late := now.Sub(k.first) < lateWindow
		if late {
			k.failed++
		} else if k.firstOK.IsZero() {
			k.firstOK = now
			_, k.usedAtOK, _ = k.n.ImageStoreUsage()
		}
		k.mu.Unlock()
		if late {
			// The kubelet's answer while its stats provider has no data yet.
			http.Error(w, "Internal Error: failed to get node info: node \""+k.n.Name+"\" not found", http.StatusInternalServerError)
			return
		}
	}
	k.proxy.ServeHTTP(w, r)
}

func (k *lateKubelet) record() (first, firstOK time.Time, failed int, usedAtOK uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.first, k.firstOK, k.failed, k.usedAtOK
}

// startLateKubelet listens on n's IP, port 10259, in the cluster's network
// namespace, and sends fetch's connections to n's kubelet there (an
// iptables DNAT rule for processes of group fetchGID).
func startLateKubelet(t *testing.T, n *cluster.Node) *lateKubelet {
	t.Helper()
	cfg, err := c.RESTConfig() // the admin's client certificate, which the kubelet accepts
	if err != nil {
		t.Fatal(err)
	}
	cfg = rest.CopyConfig(cfg)
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kubeletURL := &url.URL{Scheme: "https", Host: net.JoinHostPort(n.IP, "10250")}
	k := &lateKubelet{n: n, proxy: &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(kubeletURL) },
		Transport: rt,
	}}
	const port = "10259"
	var ln net.Listener
	if err := c.NetNS.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(n.IP, port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: k, ReadHeaderTimeout: 10 * time.Second}
	cert, key := n.KubeletServingCert()
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, cert, key) }()
	rule := []string{"-t", "nat", "OUTPUT", "-d", n.IP + "/32", "-p", "tcp", "--dport", "10250",
		"-m", "owner", "--gid-owner", strconv.Itoa(fetchGID), "-j", "DNAT", "--to-destination", net.JoinHostPort(n.IP, port)}
	iptables(t, "-A", rule)
	t.Cleanup(func() {
		iptables(t, "-D", rule)
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("the kubelet's stand-in: %v", err)
		}
	})
	return k
}

// iptables runs `iptables -w -t nat <op> <chain> <match...>` in the
// cluster's network namespace; rule is the table, the chain, then the rule.
func iptables(t *testing.T, op string, rule []string) {
	t.Helper()
	args := append([]string{"--net=" + c.NetNS.Path, "--", "iptables", "-w", rule[0], rule[1], op}, rule[2:]...)
	if out, err := exec.Command("nsenter", args...).CombinedOutput(); err != nil {
		t.Fatalf("iptables %s: %v: %s", strings.Join(args[3:], " "), err, out)
	}
}

// removeLabel deletes instance's label and annotation from the node:
// fetch, run by hand, has no uninstall.
func removeLabel(t *testing.T, instance string) {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Error(err)
		return
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%[1]q:null},"annotations":{%[1]q:null}}}`, labelDomain+instance)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Nodes().Patch(ctx, c.Nodes()[0].Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Error(err)
	}
}
