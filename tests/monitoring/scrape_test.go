package monitoring_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

const (
	namespace = "prefetch"
	instance  = "demo"
	present   = "ghcr.io/team/present:1"
	// missing is in no repository of the registry: every pull is a 404.
	missing = "ghcr.io/team/missing:1"
	// other is pushed but never pulled before the slot test, so that the
	// agent needs a slot for it.
	other = "ghcr.io/team/other:1"
)

// Scrape is one /metrics exposition of the agent: series (name and labels
// as exposed) to value.
type Scrape map[string]float64

// Scrapes are the agent's expositions in the states the alerts are about,
// each taken from the real agent binary, running against a real containerd
// and kube-apiserver.
type Scrapes struct {
	// Succeeded: watch found every image present.
	Succeeded Scrape
	// Conflict: the same watch after someone else rewrote its node key.
	Conflict Scrape
	// OwnerConflict: the same watch after the key's annotation came to name
	// the same-name instance of another namespace as its owner.
	OwnerConflict Scrape
	// Failed: watch with an image the registry does not have.
	Failed Scrape
	// SlotWaiting: fetch waiting for the only herd-control slot, which
	// another node holds.
	SlotWaiting Scrape
}

// takeScrapes starts a control plane and one containerd, runs the agent
// through the five states and scrapes each.
func takeScrapes(t *testing.T, agentBin string) Scrapes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	nodes, err := c.StartRuntimes(ctx, 1, cluster.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := nodes[0]
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	for i, ref := range []string{present, other} {
		img, err := ociimage.Data(int64(i+1), 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Push(ctx, img, strings.TrimPrefix(ref, "ghcr.io/")); err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Transport: &http.Transport{DialContext: c.NetNS.DialContext}, Timeout: 5 * time.Second}
	var s Scrapes

	const addr = "127.0.0.1:19100"
	agent := func(args ...string) *exec.Cmd {
		t.Helper()
		base := []string{"--kubeconfig=" + c.Kubeconfig, "--cri-socket=" + n.CRISocket, "--node-name=" + n.Name,
			"--instance=" + instance, "--metrics-addr=" + addr, "--initial-pull-attempt-delay=100ms"}
		cmd := c.Command(ctx, agentBin, append(args[:1:1], append(base, args[1:]...)...)...)
		cmd.Env = append(cmd.Env, "POD_NAME=image-prefetcher-"+instance+"-x", "POD_NAMESPACE="+namespace)
		log, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				b, _ := os.ReadFile(log.Name())
				t.Logf("agent %v log:\n%s", args, b)
			}
		})
		return cmd
	}
	stop := func(cmd *exec.Cmd) {
		t.Helper()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	waitScrape := func(what string, cond func(Scrape) bool) Scrape {
		t.Helper()
		var last Scrape
		var lastErr error
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			last, lastErr = scrape(ctx, client, "http://"+addr+"/metrics")
			if lastErr == nil && cond(last) {
				return last
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("gave up waiting for %s; last scrape %v, err %v", what, last, lastErr)
		return nil
	}

	w := agent("watch", "--refresh-interval=1s", present)
	s.Succeeded = waitScrape("succeeded", func(m Scrape) bool { return m["image_prefetcher_succeeded"] == 1 })
	// The agent has written the label: what it finds changed from now on
	// was changed by someone else.
	waitScrape("the node label", func(Scrape) bool {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && node.Labels[v1alpha1.NodeKey(instance)] == v1alpha1.LabelSucceeded
	})
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"failed"}}}`, v1alpha1.NodeKey(instance))
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Conflict = waitScrape("a label conflict", func(m Scrape) bool { return m["image_prefetcher_label_conflicts_total"] == 1 })
	owner, err := json.Marshal(map[string]label.Owner{"owner": label.NewOwner("elsewhere", instance)})
	if err != nil {
		t.Fatal(err)
	}
	patch = fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.NodeKey(instance), owner)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.OwnerConflict = waitScrape("an owner conflict", func(m Scrape) bool {
		return m["image_prefetcher_owner_conflict"] == 1
	})
	stop(w)
	// The next agent starts on a free key, as on a node nobody labelled.
	patch = fmt.Appendf(nil, `{"metadata":{"labels":{%[1]q:null},"annotations":{%[1]q:null}}}`, v1alpha1.NodeKey(instance))
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	w = agent("watch", "--refresh-interval=1s", present, missing)
	s.Failed = waitScrape("failed", func(m Scrape) bool {
		_, ok := m[fmt.Sprintf(`image_prefetcher_image_failed{image=%q,reason="NotFound"}`, missing)]
		return ok && m["image_prefetcher_succeeded"] == 0
	})
	stop(w)

	holdSlot(ctx, t, cs)
	f := agent("fetch", "--max-concurrent-nodes=1", other)
	s.SlotWaiting = waitScrape("a slot wait", func(m Scrape) bool { return m["image_prefetcher_slot_waiting"] == 1 })
	stop(f)
	return s
}

// holdSlot gives the only slot to another node, for an hour.
func holdSlot(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	holder, dur := "node-elsewhere", int32(3600)
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: slots.SlotName(instance, 0), Namespace: namespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now},
	}
	if _, err := cs.CoordinationV1().Leases(namespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// scrape reads the text exposition into series -> value.
func scrape(ctx context.Context, client *http.Client, url string) (Scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return parseExposition(resp.Body)
}

func parseExposition(r io.Reader) (Scrape, error) {
	out := Scrape{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("exposition line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("exposition line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// Names are the metric names of a scrape; a histogram's _bucket, _sum and
// _count are listed as they are exposed.
func (s Scrape) Names() map[string]bool {
	names := map[string]bool{}
	for series := range s {
		name, _, _ := strings.Cut(series, "{")
		names[name] = true
	}
	return names
}
