package runtimes_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

const labelDomain = "image-prefetcher.stackrox.io/"

// permanentBound is how soon a permanent error must label the node.
const permanentBound = 30 * time.Second

// outcome is what one image of a run must end as.
type outcome struct {
	// reason is the annotation's reason, "" when the image must be present.
	reason string
	// attempts is the agent's attempt count; per runtime where they
	// differ (containerd 2.x and CRI-O retry some statuses themselves).
	attempts   int
	attemptsBy map[cluster.Runtime]int
	// atLeast makes attempts a lower bound.
	atLeast bool
}

func (o outcome) attemptsOn(rt cluster.Runtime) int {
	if a, ok := o.attemptsBy[rt]; ok {
		return a
	}
	return o.attempts
}

// matrixCase is one scenario of the matrix on one runtime: prepare pushes
// images and switches faults on, and returns the list and what each of its
// entries must end as; during, if set, runs while the agent does.
type matrixCase struct {
	name    string
	bound   time.Duration
	flags   []string
	prepare func(ctx context.Context, t *testing.T, n *node, r *agentRun) ([]string, map[string]outcome)
	during  func(ctx context.Context, t *testing.T, n *node)
	// after runs once the agent is done, for assertions of its own.
	after func(ctx context.Context, t *testing.T, n *node, list []string)
}

// agentRun is what a case can set up for its agent.
type agentRun struct {
	dockerConfig string
}

func matrixCases() []matrixCase {
	reg := func() *registry.Registry { return c.Registry() }
	present := outcome{attempts: 1}
	return []matrixCase{
		{name: "all-good", bound: time.Minute, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("good-a")+":v1", 20)
			pushData(ctx, t, n.repo("good-b")+":v2", 21)
			a, b := n.ref("good-a", "v1"), n.ref("good-b", "v2")
			return []string{a, b}, map[string]outcome{a: present, b: present}
		}, after: func(ctx context.Context, t *testing.T, n *node, list []string) {
			// Present images are skipped: a second run sends the registry
			// nothing for them.
			before := len(reg().Requests(registry.Match{Repo: "m/" + string(n.rt) + "/good-*"}))
			res := runAgent(ctx, t, n, "all-good-again", list, nil)
			if res.label != "succeeded" {
				t.Errorf("second run: label %q, want succeeded", res.label)
			}
			if after := len(reg().Requests(registry.Match{Repo: "m/" + string(n.rt) + "/good-*"})); after != before {
				t.Errorf("second run sent the registry %d requests for present images, want 0", after-before)
			}
		}},
		{name: "missing-tag", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("mx-tag")+":v1", 22)
			ref := n.ref("mx-tag", "typo")
			return []string{ref}, map[string]outcome{ref: {reason: "NotFound", attempts: 3}}
		}},
		{name: "missing-repo", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			ref := n.ref("mx-no-such-repo", "v1")
			return []string{ref}, map[string]outcome{ref: {reason: "NotFound", attempts: 3}}
		}},
		{name: "401-without-credentials", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("mx-private")+":v1", 23)
			reg().RequireAuth(n.repo("mx-private"), testUser, testPassword)
			ref := n.ref("mx-private", "v1")
			return []string{ref}, map[string]outcome{ref: {reason: "Unauthorized", attempts: 3}}
		}},
		{name: "401-with-credentials", bound: time.Minute, prepare: func(ctx context.Context, t *testing.T, n *node, r *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("mx-private2")+":v1", 24)
			reg().RequireAuth(n.repo("mx-private2"), testUser, testPassword)
			r.dockerConfig = writeDockerConfig(t, cluster.RegistryAddr, testUser, testPassword)
			ref := n.ref("mx-private2", "v1")
			return []string{ref}, map[string]outcome{ref: present}
		}},
		{name: "403", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("mx-forbidden")+":v1", 25)
			reg().Fail(registry.Match{Repo: n.repo("mx-forbidden"), Kind: registry.Manifests}, 403, 0)
			ref := n.ref("mx-forbidden", "v1")
			return []string{ref}, map[string]outcome{ref: {reason: "Forbidden", attempts: 3}}
		}},
		{name: "429-then-success", bound: time.Minute, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("mx-429")+":v1", 26)
			// Every runtime retries a 429 itself within one call (containerd
			// up to 5 requests, CRI-O 5 times after Retry-After): 12 of them
			// outlast those retries, so the agent must retry too.
			reg().Fail(registry.Match{Repo: n.repo("mx-429"), Kind: registry.Manifests}, 429, 12)
			ref := n.ref("mx-429", "v1")
			return []string{ref}, map[string]outcome{ref: {attempts: 2, atLeast: true}}
		}},
		{name: "503-then-success", bound: time.Minute, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushData(ctx, t, n.repo("mx-503")+":v1", 27)
			reg().Fail(registry.Match{Repo: n.repo("mx-503"), Kind: registry.Manifests}, 503, 2)
			ref := n.ref("mx-503", "v1")
			// containerd 2.x retries a 5xx once within one call.
			return []string{ref}, map[string]outcome{ref: {attempts: 3, attemptsBy: map[cluster.Runtime]int{cluster.Containerd2: 2}}}
		}},
		{name: "stalled-blob", bound: time.Minute, flags: []string{"--initial-pull-attempt-timeout=3s"}, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			img := pushData(ctx, t, n.repo("mx-stall")+":v1", 28)
			// One layer is held on its first GET until the attempt's
			// deadline cuts it; the second attempt gets it.
			reg().Stall(registry.Match{Repo: n.repo("mx-stall"), Ref: firstLayer(t, img)}, 1, 0)
			ref := n.ref("mx-stall", "v1")
			return []string{ref}, map[string]outcome{ref: {attempts: 2}}
		}},
		{name: "blob-redirect-expired", bound: permanentBound, flags: []string{"--overall-timeout=12s"}, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			// Every blob GET is sent to an object store that refuses the
			// expired URL. Transient: retried until the overall timeout
			// (attempts at about 0, 1, 3 and 7 s, ±20%), not given up on
			// after the 3 attempts of a permanent error.
			pushData(ctx, t, n.repo("mx-expired")+":v1", 29)
			reg().RedirectBlobs(registry.Match{Repo: n.repo("mx-expired")}, "http://"+objectStoreAddr, 0)
			ref := n.ref("mx-expired", "v1")
			return []string{ref}, map[string]outcome{ref: {reason: "Forbidden", attempts: 4, atLeast: true}}
		}},
		{name: "invalid-reference", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			ref := cluster.RegistryAddr + "/" + n.repo("Upper") + ":v1"
			return []string{ref}, map[string]outcome{ref: {reason: "InvalidReference", attempts: 0}}
		}},
		{name: "platform-mismatch", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			pushForeignIndex(ctx, t, n.repo("mx-foreign")+":v1")
			ref := n.ref("mx-foreign", "v1")
			return []string{ref}, map[string]outcome{ref: {reason: "PlatformMismatch", attempts: 3}}
		}},
		{name: "bad-list", bound: permanentBound, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			// Good lines are pulled even when others are garbage.
			pushData(ctx, t, n.repo("mx-listok")+":v1", 30)
			good := n.ref("mx-listok", "v1")
			bad := "not a reference!"
			return []string{good, bad, "# a comment", good}, map[string]outcome{good: present, bad: {reason: "InvalidReference"}}
		}},
		{name: "runtime-restarted-mid-pull", bound: 2 * time.Minute, flags: []string{"--initial-pull-attempt-timeout=60s"}, prepare: func(ctx context.Context, t *testing.T, n *node, _ *agentRun) ([]string, map[string]outcome) {
			img := pushData(ctx, t, n.repo("mx-restart")+":v1", 31)
			reg().Stall(registry.Match{Repo: n.repo("mx-restart"), Ref: firstLayer(t, img)}, 1, 0)
			ref := n.ref("mx-restart", "v1")
			// The attempt in flight fails; the next ones may still find the
			// runtime starting.
			return []string{ref}, map[string]outcome{ref: {attempts: 2, atLeast: true}}
		}, during: func(ctx context.Context, t *testing.T, n *node) {
			// Restart once a layer GET is held: the pull is mid-way. The
			// call in flight fails with the runtime; the next attempt
			// pulls.
			m := registry.Match{Repo: n.repo("mx-restart"), Ref: firstLayer(t, mustData(t, 31))}
			deadline := time.Now().Add(30 * time.Second)
			for reg().Stalled(m) == 0 {
				if time.Now().After(deadline) {
					t.Error("the runtime never started fetching the layer")
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err := n.node.RestartContainerd(ctx); err != nil {
				t.Errorf("restart %s: %v", n.rt, err)
			}
		}},
	}
}

// TestMatrix runs the agent binary's fetch against each real runtime, a
// real kube-apiserver and the fault-injecting registry, for every case of
// the issue, and checks the label, the reason in the annotation, the
// attempt count and the time bound. Runtimes run in parallel, each one's
// cases one after the other.
func TestMatrix(t *testing.T) {
	startObjectStore(t)
	forEachRuntime(t, func(t *testing.T, n *node) {
		createNode(t, n)
		for _, mc := range matrixCases() {
			t.Run(mc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				defer cancel()
				r := &agentRun{}
				list, want := mc.prepare(ctx, t, n, r)
				done := make(chan struct{})
				if mc.during != nil {
					go func() {
						defer close(done)
						mc.during(ctx, t, n)
					}()
				} else {
					close(done)
				}
				res := runAgent(ctx, t, n, mc.name, list, append(mc.flags, r.flags()...))
				<-done
				t.Logf("%s on %s: label %s after %s", mc.name, n.rt, res.label, res.elapsed.Round(100*time.Millisecond))
				wantLabel := "succeeded"
				for _, o := range want {
					if o.reason != "" {
						wantLabel = "failed"
					}
				}
				if res.label != wantLabel {
					t.Errorf("label %q, want %q; annotation %s", res.label, wantLabel, res.annotation)
				}
				if res.elapsed > mc.bound {
					t.Errorf("labeled after %s, want within %s", res.elapsed, mc.bound)
				}
				reasons := map[string]string{}
				for _, f := range res.summary.Failed {
					reasons[f.Image] = f.Reason
				}
				for img, o := range want {
					if got := reasons[img]; got != o.reason {
						t.Errorf("%s: reason %q, want %q (annotation %s)", img, got, o.reason, res.annotation)
					}
					if o.reason == "InvalidReference" && o.attempts == 0 {
						continue
					}
					if got, w := res.attempts[img], o.attemptsOn(n.rt); got != w && !(o.atLeast && got > w) {
						t.Errorf("%s: %d attempts, want %d (at least: %v)", img, got, w, o.atLeast)
					}
				}
				if t.Failed() {
					t.Logf("agent log:\n%s", res.log)
				}
				if mc.after != nil {
					mc.after(ctx, t, n, list)
				}
			})
		}
	})
}

func (r *agentRun) flags() []string {
	if r.dockerConfig == "" {
		return nil
	}
	return []string{"--docker-config=" + r.dockerConfig}
}

// firstLayer is the digest of img's first layer.
func firstLayer(t *testing.T, img v1.Image) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// mustData is pushData's image without pushing it.
func mustData(t *testing.T, seed int64) v1.Image {
	t.Helper()
	img, err := ociimage.Data(seed, 64<<10, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// createNode creates the runtime's Node object, which the agent labels.
func createNode(t *testing.T, n *node) {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.node.Name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

type agentResult struct {
	label      string
	annotation string
	summary    label.Summary
	attempts   map[string]int
	elapsed    time.Duration
	log        string
}

// runAgent runs `image-prefetcher fetch` for list on n's runtime as
// instance (a fresh label key per case), and reads back what it wrote.
func runAgent(ctx context.Context, t *testing.T, n *node, instance string, list []string, flags []string) agentResult {
	t.Helper()
	return runAgentWith(ctx, t, c.Command, n, instance, list, flags)
}

// runAgentIn is runAgent with the agent inside the node's mount
// namespace, where the node's small image store is mounted (disk_test.go).
func runAgentIn(ctx context.Context, t *testing.T, n *node, instance string, list []string, flags []string) agentResult {
	t.Helper()
	return runAgentWith(ctx, t, n.node.Command, n, instance, list, flags)
}

func runAgentWith(ctx context.Context, t *testing.T, command func(context.Context, string, ...string) *exec.Cmd, n *node, instance string, list []string, flags []string) agentResult {
	t.Helper()
	instance = slug(instance)
	dir := t.TempDir()
	listFile := filepath.Join(dir, "images.txt")
	if err := os.WriteFile(listFile, []byte(strings.Join(list, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"fetch",
		"--kubeconfig=" + c.Kubeconfig,
		"--cri-socket=" + n.node.CRISocket,
		"--node-name=" + n.node.Name,
		"--instance=" + instance,
		// The owner recorded with the key; labeling needs it.
		"--namespace=image-prefetcher-runtimes",
		"--image-list-file=" + listFile,
		"--log-format=json",
	}, flags...)
	var out bytes.Buffer
	cmd := command(ctx, agentBin(), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	res := agentResult{elapsed: time.Since(start), log: out.String(), attempts: map[string]int{}}
	if err != nil {
		t.Fatalf("fetch: %v\n%s", err, out.String())
	}
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, n.node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key := labelDomain + instance
	res.label, res.annotation = node.Labels[key], node.Annotations[key]
	if res.summary, err = label.Parse(res.annotation); err != nil {
		t.Fatalf("annotation %q: %v", res.annotation, err)
	}
	// The agent logs each image's outcome with its attempt count, under
	// the reference it sent to the runtime.
	sc := bufio.NewScanner(strings.NewReader(res.log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Msg      string `json:"msg"`
			Image    string `json:"image"`
			Attempts int    `json:"attempts"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && (l.Msg == "pulled" || l.Msg == "pull failed") {
			res.attempts[l.Image] = l.Attempts
		}
	}
	return res
}

// writeDockerConfig writes a pull secret's .dockerconfigjson for host.
func writeDockerConfig(t *testing.T, host, user, password string) string {
	t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	p := filepath.Join(t.TempDir(), "config.json")
	data := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
