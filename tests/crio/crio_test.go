// Package crio_test runs the product on a node whose kubelet runs on real
// CRI-O (tests/cluster, cluster.CRIO), as OpenShift nodes do: the function
// renders the agent with `runtime: crio` and CRI-O's default socket, the
// real kubelet runs it through CRI-O, and the scenarios check the node
// label and the images through CRI-O's CRI. One node, to stay lean; the
// runtime matrix (tests/runtimes) covers the error cases on CRI-O.
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/crio/ (after `make build
// tools host-deps kube runtimes`).
package crio_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

const labelDomain = "image-prefetcher.stackrox.io/"

var c *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, cluster.Options{
		Deploys:          true,
		Nodes:            1,
		NodeRuntime:      func(int) cluster.Runtime { return cluster.CRIO },
		ShortNameAliases: map[string]string{"app": cluster.RegistryAddr + "/aliased/app"},
		// The kubelet serves a self-signed certificate, as kubeadm's does: the
		// agent reads the image filesystem from its own root (disk_test.go).
	}, &c))
}

// deploy renders an ImagePrefetcher with `runtime: crio` (spec is the YAML
// under spec: besides agent.image and runtime) through the real kustomize
// and function, and applies it with extra resources.
func deploy(t *testing.T, name, spec string, extra ...string) {
	t.Helper()
	deployRefresh(t, name, spec, 0, extra...)
}

// deployRefresh is deploy with watch checking every refresh (see
// cluster.ShortenRefresh); 0 keeps the rendered interval.
func deployRefresh(t *testing.T, name, spec string, refresh time.Duration, extra ...string) {
	t.Helper()
	if refresh > 0 {
		spec += "  refreshInterval: 1m\n"
	}
	resources := map[string]string{}
	for i, e := range extra {
		resources[fmt.Sprintf("extra-%d.yaml", i)] = e
	}
	p := cluster.Prefetcher{
		Name: name, Namespace: name, AgentImage: c.AgentImage(t),
		Spec:      "  runtime: crio\n" + spec,
		Resources: resources,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	manifests, err := p.Render(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(manifests, []byte("/var/run/crio")) {
		t.Fatalf("the rendered agent does not mount CRI-O's socket directory:\n%s", manifests)
	}
	if refresh > 0 {
		if manifests, err = cluster.ShortenRefresh(manifests, refresh); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Apply(ctx, manifests, cluster.ApplyOptions{}); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

// waitLabel waits until the node's label of instance is want and returns
// the annotation's summary.
func waitLabel(t *testing.T, instance, want string, timeout time.Duration) label.Summary {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	node := c.Nodes()[0].Name
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err == nil {
			key := labelDomain + instance
			last = n.Labels[key] + " " + n.Annotations[key]
			if n.Labels[key] == want {
				s, err := label.Parse(n.Annotations[key])
				if err != nil {
					t.Fatalf("annotation: %v", err)
				}
				return s
			}
		}
		if time.Now().After(deadline) {
			c.DumpLogs(t)
			t.Fatalf("%s: label %s not %q within %s; last: %s", node, instance, want, timeout, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// images pushes data images as e2e/<name>:v1 and returns how pods name
// them (ghcr.io, which the CRI-O node's registries.conf and /etc/hosts send
// to the run's registry).
func images(t *testing.T, seed int64, names ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var refs []string
	for i, n := range names {
		img, err := ociimage.Data(seed+int64(i), 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Push(ctx, img, "e2e/"+n+":v1"); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, "ghcr.io/e2e/"+n+":v1")
	}
	return refs
}

func list(refs ...string) string {
	return "  images:\n  - " + strings.Join(refs, "\n  - ") + "\n"
}

func present(t *testing.T, ref string) bool {
	t.Helper()
	cri, err := c.Nodes()[0].CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	st, err := cri.Images.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("CRI-O ImageStatus %s: %v", ref, err)
	}
	return st.GetImage() != nil
}

// The rendered agent runs on CRI-O and pulls the whole list through it.
func TestCRIOHappyPath(t *testing.T) {
	refs := images(t, 700, "crio-a", "crio-b")
	deploy(t, "crio-happy", list(refs...))
	s := waitLabel(t, "crio-happy", "succeeded", 3*time.Minute)
	if s.Present != 2 {
		t.Errorf("summary %+v, want 2 present", s)
	}
	for _, r := range refs {
		if !present(t, r) {
			t.Errorf("%s is not in CRI-O's store", r)
		}
	}
}

// A missing image labels the node failed with NotFound, and fast: the
// permanent-error path, on CRI-O's wording.
func TestCRIOMissingImage(t *testing.T) {
	refs := images(t, 710, "crio-ok")
	typo := "ghcr.io/e2e/crio-ok:typo"
	deploy(t, "crio-missing", list(refs[0], typo))
	s := waitLabel(t, "crio-missing", "failed", 3*time.Minute)
	if len(s.Failed) != 1 || s.Failed[0].Image != typo || s.Failed[0].Reason != "NotFound" {
		t.Errorf("summary %+v, want %s failed as NotFound", s, typo)
	}
	if s.DurationSeconds > 30 {
		t.Errorf("the check took %.1fs, want the missing image given up on within 30 s", s.DurationSeconds)
	}
}

// A private image fails as Unauthorized without credentials and is pulled
// with a pull secret in imagePullSecrets.
func TestCRIOPullSecret(t *testing.T) {
	refs := images(t, 720, "crio-private")
	c.Registry().RequireAuth("e2e/crio-private", "puller", "s3cret")
	cfg := fmt.Sprintf(`{"auths":{"ghcr.io":{"auth":%q}}}`, base64.StdEncoding.EncodeToString([]byte("puller:s3cret")))
	secret := fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\n  namespace: crio-private\ntype: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: %s\n",
		base64.StdEncoding.EncodeToString([]byte(cfg)))
	deploy(t, "crio-private", list(refs...)+"  imagePullSecrets:\n  - regcred\n", secret)
	s := waitLabel(t, "crio-private", "succeeded", 3*time.Minute)
	if s.Present != 1 || !present(t, refs[0]) {
		t.Errorf("summary %+v, want the private image present", s)
	}
}

// An image removed from CRI-O (as the kubelet's image GC does) is pulled
// again by the watch container, and the label stays succeeded.
func TestCRIOImageGCRepair(t *testing.T) {
	refs := images(t, 730, "crio-gc")
	deployRefresh(t, "crio-gc", list(refs...), 3*time.Second)
	waitLabel(t, "crio-gc", "succeeded", 3*time.Minute)
	if err := c.Nodes()[0].Remove(context.Background(), refs[0]); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	for !present(t, refs[0]) {
		if time.Since(removed) > time.Minute {
			t.Fatalf("%s was not pulled again within a minute of its removal", refs[0])
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pulled again %.1fs after its removal", time.Since(removed).Seconds())
	if s := waitLabel(t, "crio-gc", "succeeded", 10*time.Second); s.Present != 1 {
		t.Errorf("summary %+v after the repair", s)
	}
}

// A list entry "app" is prefetched from where a pod's `image: app` comes
// from on CRI-O: the node's registries.conf alias. The pod then starts with
// imagePullPolicy Never, so from the prefetched image alone.
func TestCRIOShortNameAlias(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.PushPause(ctx, "aliased/app:latest", "65535:65535"); err != nil {
		t.Fatal(err)
	}
	deploy(t, "crio-alias", list("app"))
	if s := waitLabel(t, "crio-alias", "succeeded", 3*time.Minute); s.Present != 1 {
		t.Fatalf("summary %+v", s)
	}
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "uses-app", Namespace: "crio-alias", Labels: map[string]string{"app": "uses-app"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app", ImagePullPolicy: corev1.PullNever}}},
	}
	if _, err := cs.CoreV1().Pods("crio-alias").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPodsRunning(ctx, "crio-alias", "app=uses-app", 1); err != nil {
		t.Fatalf("a pod with image: app and imagePullPolicy: Never did not start from the prefetched image: %v", err)
	}
}
