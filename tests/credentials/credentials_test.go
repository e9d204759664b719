// Package credentials_test runs prefetched private images under the
// kubelet's credential verification (KEP-2535, KubeletEnsureSecretPulledImages,
// on by default since 1.35): one cluster, three kubelets, each with its own
// imagePullCredentialsVerificationPolicy, a registry that requires auth for
// the private repository, and the agent prefetching a private image (with a
// pull secret) and a public one (without). Pods then start with or without
// the secret; the test asserts which run, which are refused, and what the
// registry served for each start (its own request log).
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/credentials/ (after
// `make build tools host-deps kube`).
package credentials_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/agent/hits"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

const (
	privateRepo = "e2e/cred-private"
	publicRepo  = "e2e/cred-public"
	privateImg  = "ghcr.io/" + privateRepo + ":v1"
	publicImg   = "ghcr.io/" + publicRepo + ":v1"
	user, pass  = "puller", "s3cret"
	apps        = "apps"
	secretName  = "regcred"
)

// The policy of node i's kubelet; node 0 keeps the default.
var policies = []string{"NeverVerifyPreloadedImages (default)", "AlwaysVerify", "NeverVerifyAllowlistedImages"}

// allowlist is node 2's preloadedImagesVerificationAllowlist: the public
// image as pods write it. TestCredentialPolicies checks that
// `image-prefetcher allowlist` prints exactly this for the rendered list.
var allowlist = []string{"ghcr.io/" + publicRepo}

var c *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, cluster.Options{
		Deploys: true,
		Nodes:   3,
		NodeKubeletConfig: func(i int) map[string]any {
			switch i {
			case 1:
				return map[string]any{"imagePullCredentialsVerificationPolicy": "AlwaysVerify"}
			case 2:
				return map[string]any{"imagePullCredentialsVerificationPolicy": "NeverVerifyAllowlistedImages", "preloadedImagesVerificationAllowlist": allowlist}
			}
			return nil
		},
	}, &c))
}

func pullSecret(namespace string) string {
	cfg := fmt.Sprintf(`{"auths":{"ghcr.io":{"auth":%q}}}`, base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
	return fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\ntype: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: %s\n",
		secretName, namespace, base64.StdEncoding.EncodeToString([]byte(cfg)))
}

// startCase is one pod start: on node Node, image Image, with or without
// the pull secret.
type startCase struct {
	node   int
	image  string
	secret bool
	// runs: the pod must run; otherwise the kubelet must refuse the image.
	runs bool
	// verified: the start may make manifest requests (never a blob GET);
	// otherwise it must make no registry request at all.
	verified bool
}

func TestCredentialPolicies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	// Two users, two configs, two digests: one image to containerd would
	// make the public one private too.
	if err := c.PushPause(ctx, privateRepo+":v1", "65531:65531"); err != nil {
		t.Fatal(err)
	}
	if err := c.PushPause(ctx, publicRepo+":v1", "65530:65530"); err != nil {
		t.Fatal(err)
	}
	reg := c.Registry()
	reg.RequireAuth(privateRepo, user, pass)

	// Two instances: "private" pulls with a pull secret, "public" without,
	// so the rendered list says which images are public.
	var rendered []byte
	for _, p := range []cluster.Prefetcher{
		{Name: "private", Namespace: "private", Spec: "  images:\n  - " + privateImg + "\n  imagePullSecrets:\n  - " + secretName + "\n", Resources: map[string]string{"secret.yaml": pullSecret("private")}},
		{Name: "public", Namespace: "public", Spec: "  images:\n  - " + publicImg + "\n"},
	} {
		p.AgentImage = c.AgentImage(t)
		m, err := p.Render(ctx, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Apply(ctx, m, cluster.ApplyOptions{}); err != nil {
			t.Fatalf("apply %s: %v", p.Name, err)
		}
		rendered = append(rendered, append([]byte("---\n"), m...)...)
	}
	t.Run("allowlist", func(t *testing.T) { checkAllowlist(ctx, t, rendered) })

	for _, n := range c.Nodes() {
		for _, inst := range []string{"private", "public"} {
			if _, err := c.WaitNode(ctx, n.Name, func(n *corev1.Node) bool { return n.Labels[v1alpha1.NodeKey(inst)] == v1alpha1.LabelSucceeded }); err != nil {
				t.Fatalf("%s: label %s: %v", n.Name, inst, err)
			}
		}
	}
	if _, err := c.CreateNamespace(ctx, apps); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, []byte(pullSecret(apps)), cluster.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}

	cases := []startCase{
		{node: 0, image: privateImg, secret: false, runs: true},
		{node: 0, image: privateImg, secret: true, runs: true},
		{node: 1, image: privateImg, secret: false, runs: false, verified: true},
		{node: 1, image: privateImg, secret: true, runs: true, verified: true},
		// The verified start left the kubelet a record of the secret for
		// this image: the next pod with it starts without a round-trip,
		// and a pod without it is still refused.
		{node: 1, image: privateImg, secret: true, runs: true},
		{node: 1, image: privateImg, secret: false, runs: false, verified: true},
		{node: 1, image: publicImg, secret: false, runs: true, verified: true},
		{node: 2, image: publicImg, secret: false, runs: true},
		{node: 2, image: privateImg, secret: false, runs: false, verified: true},
		{node: 2, image: privateImg, secret: true, runs: true, verified: true},
	}
	for i, tc := range cases {
		name := fmt.Sprintf("%s/%s/secret=%v", strings.Fields(policies[tc.node])[0], strings.TrimPrefix(tc.image, "ghcr.io/e2e/"), tc.secret)
		t.Run(name, func(t *testing.T) { start(ctx, t, cs, fmt.Sprintf("start-%d", i), tc) })
	}
	t.Run("status", func(t *testing.T) { checkStatus(ctx, t) })
}

// checkStatus runs `status` and `status --hits` with the cluster's admin
// kubeconfig. The private instance's agents pull with credentials, which
// the table's "Private images" line names. A start that only verified
// (node 2, AlwaysVerify) has the kubelet's Event of a download: --hits
// counts it a miss, and its note says why that may not be a download.
func checkStatus(ctx context.Context, t *testing.T) {
	out, err := c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--kubeconfig", c.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^Private images: private pull with credentials\. .*AlwaysVerify`).Match(out) {
		t.Errorf("status names no private instance:\n%s", out)
	}
	out, err = c.Command(ctx, cluster.BinPath("image-prefetcher"), "status", "--hits", "-o", "json", "--kubeconfig", c.Kubeconfig, "--instance", "private").Output()
	if err != nil {
		t.Fatalf("status --hits: %v\n%s", err, out)
	}
	var r hits.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	byNode := map[string]hits.Counts{}
	for _, i := range r.Instances {
		for _, n := range i.Nodes {
			byNode[n.Node] = n.Counts
		}
	}
	nodes := c.Nodes()
	// node 1: two hits; node 2: the verified start a miss, the one after
	// it a hit; node 3: the verified start a miss.
	if byNode[nodes[0].Name].Hits != 2 || byNode[nodes[1].Name].Misses != 1 || byNode[nodes[2].Name].Misses != 1 || r.Note != hits.VerificationNote {
		t.Errorf("status --hits:\n%s", out)
	}
}

// start runs one case: it creates the pod, waits until it runs or the
// kubelet refuses its image, checks what the registry served meanwhile,
// and deletes the pod (and waits until it is gone, so that a refused
// pod's retries do not count for the next case).
func start(ctx context.Context, t *testing.T, cs *kubernetes.Clientset, name string, tc startCase) {
	node := c.Nodes()[tc.node].Name
	repo := strings.TrimSuffix(strings.TrimPrefix(tc.image, "ghcr.io/"), ":v1")
	reg := c.Registry()
	before := len(reg.Requests(registry.Match{Repo: repo}))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: apps},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{{Name: "app", Image: tc.image, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	if tc.secret {
		pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: secretName}}
		// The kubelet reads a pod's pull secrets once its volumes are
		// mounted, through the same cache, and skips one it cannot read
		// yet (Event FailedToRetrieveImagePullSecret): a pull without it,
		// a 401 and a 10 s back-off. A new pod's secret can be forbidden
		// to its node for a moment (the Node authorizer's graph learns of
		// the pod as the kubelet does); an earlier version of this test
		// failed so in 1 run of ~8. Mounting the secret makes the kubelet
		// wait until it can read it (the mount retries).
		pod.Spec.Volumes = []corev1.Volume{{Name: "pull-secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secretName}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "pull-secret", MountPath: "/pull-secret", ReadOnly: true}}
	}
	created := time.Now()
	if _, err := cs.CoreV1().Pods(apps).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer deletePod(ctx, t, cs, name)
	var outcome string
	err := cluster.Poll(ctx, 50*time.Millisecond, "pod "+name+" running or refused", func() (bool, string) {
		p, err := cs.CoreV1().Pods(apps).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.State.Running != nil {
				outcome = "running"
				return true, outcome
			}
			if w := st.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff" || w.Reason == "ErrImageNeverPull") {
				outcome = w.Reason + ": " + w.Message
				return true, outcome
			}
		}
		return false, string(p.Status.Phase)
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(created)
	reqs := reg.Requests(registry.Match{Repo: repo})[before:]
	if tc.runs && outcome != "running" || !tc.runs && outcome == "running" {
		t.Fatalf("on %s (%s) %s with secret=%v: %s, want runs=%v", node, policies[tc.node], tc.image, tc.secret, outcome, tc.runs)
	}
	if !tc.runs && !regexp.MustCompile(`(?i)401|unauthori`).MatchString(outcome) {
		t.Errorf("refused for another reason than the registry's 401: %s", outcome)
	}
	var seen []string
	for _, r := range reqs {
		seen = append(seen, fmt.Sprintf("%s %s %d", r.Method, r.Path, r.Status))
		if strings.Contains(r.Path, "/blobs/") && r.Method == "GET" {
			t.Errorf("a blob was served for the start: %s %s %d", r.Method, r.Path, r.Status)
		}
	}
	switch {
	case !tc.verified && len(reqs) > 0:
		t.Errorf("want no registry request, got %d: %s", len(reqs), strings.Join(seen, ", "))
	case tc.verified && len(reqs) == 0:
		t.Errorf("want the kubelet to verify with the registry, got no request")
	case tc.verified && tc.runs && tc.secret && (reqs[0].Status != 401 || reqs[len(reqs)-1].Status != 200 || len(reqs) != 2):
		// One try: the challenge, then the manifest with the secret's
		// credentials. More would be a retry (a pull without the secret).
		t.Errorf("want the challenge then the manifest (401, 200), got: %s", strings.Join(seen, ", "))
	}
	if tc.secret {
		evs, err := cs.CoreV1().Events(apps).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=FailedToRetrieveImagePullSecret"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			t.Errorf("the kubelet pulled without the pod's secret: %s", e.Message)
		}
	}
	pulled := pulledEvent(ctx, t, cs, name, tc.runs)
	t.Logf("%s on %s: %s after %d ms; registry: %d requests [%s]; kubelet: %s",
		tc.image, policies[tc.node], strings.SplitN(outcome, ":", 2)[0], took.Milliseconds(), len(reqs), strings.Join(seen, ", "), pulled)
}

// pulledEvent waits for the kubelet's Pulled Event of the pod (when it
// runs) and returns its message: "already present on machine and can be
// accessed by the pod" without a verification, "Successfully pulled image
// ... in <d>" after one, d being the verification's time.
func pulledEvent(ctx context.Context, t *testing.T, cs *kubernetes.Clientset, pod string, runs bool) string {
	if !runs {
		return "refused"
	}
	msg := ""
	if err := cluster.Poll(ctx, 100*time.Millisecond, "the Pulled Event of "+pod, func() (bool, string) {
		evs, err := cs.CoreV1().Events(apps).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=Pulled"})
		if err != nil || len(evs.Items) == 0 {
			return false, fmt.Sprint(err)
		}
		msg = evs.Items[0].Message
		return true, ""
	}); err != nil {
		t.Fatal(err)
	}
	return msg
}

func deletePod(ctx context.Context, t *testing.T, cs *kubernetes.Clientset, name string) {
	if err := cs.CoreV1().Pods(apps).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Poll(ctx, 100*time.Millisecond, "pod "+name+" gone", func() (bool, string) {
		_, err := cs.CoreV1().Pods(apps).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
}

// checkAllowlist runs `image-prefetcher allowlist` on the rendered
// manifests: the kubelet configuration it prints allowlists exactly what
// node 2's kubelet was given, under NeverVerifyAllowlistedImages.
func checkAllowlist(ctx context.Context, t *testing.T, rendered []byte) {
	f := t.TempDir() + "/rendered.yaml"
	if err := os.WriteFile(f, rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := c.Command(ctx, cluster.BinPath("image-prefetcher"), "allowlist", "-f", f).Output()
	if err != nil {
		t.Fatalf("allowlist: %v\n%s", err, out)
	}
	var cfg struct {
		Policy    string   `json:"imagePullCredentialsVerificationPolicy"`
		Allowlist []string `json:"preloadedImagesVerificationAllowlist"`
	}
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if cfg.Policy != "NeverVerifyAllowlistedImages" || !slices.Equal(cfg.Allowlist, allowlist) {
		t.Errorf("allowlist printed:\n%s\nwant NeverVerifyAllowlistedImages and %v", out, allowlist)
	}
}
