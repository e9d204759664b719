package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// TestSmoke brings up two nodes, runs a DaemonSet of an image built here
// on both, checks it through the API and each node's CRI, then checks that
// teardown leaves nothing behind.
func TestSmoke(t *testing.T) {
	// The namespace's own network settings must not leak to the host's.
	hostForward, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 2})
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			if t.Failed() {
				c.DumpLogs(t)
			}
			_ = c.Stop(context.Background())
		}
	}()

	bin, err := cluster.PauseBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	img, err := ociimage.Build(ociimage.Binary(bin, "65532:65532"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Push(ctx, img, "e2e/smoke:v1"); err != nil {
		t.Fatal(err)
	}
	const image = "ghcr.io/e2e/smoke:v1"

	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := c.CreateNamespace(ctx, "smoke")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "smoke"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:  "main",
						Image: image,
						// The node's own containerd socket directory, by the
						// path rendered manifests use.
						VolumeMounts: []corev1.VolumeMount{{Name: "cri", MountPath: "/run/containerd", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "cri", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
						Path: "/run/containerd", Type: ptr(corev1.HostPathDirectory),
					}}}},
					TerminationGracePeriodSeconds: ptr(int64(1)),
				},
			},
		},
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DaemonSet: %v", err)
	}
	pods, err := c.WaitPodsRunning(ctx, ns, "app=smoke", 2)
	if err != nil {
		t.Fatal(err)
	}
	var podNodes []string
	for _, p := range pods {
		podNodes = append(podNodes, p.Spec.NodeName)
	}
	sort.Strings(podNodes)
	if fmt.Sprint(podNodes) != "[node-1 node-2]" {
		t.Fatalf("pods run on %v, want one on each node", podNodes)
	}

	// From a pod on each node, the API answers at the kubernetes Service
	// address with the pod's own token: the path the agent takes.
	probeBin, err := cluster.ProbeBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := ociimage.Build(ociimage.Binary(probeBin, "65532:65532"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Push(ctx, probe, "e2e/probe:v1"); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probe-" + n.Name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:      n.Name,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "probe", Image: "ghcr.io/e2e/probe:v1"}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes() {
		phase, err := waitPodDone(ctx, c, ns, "probe-"+n.Name)
		if err != nil || phase != corev1.PodSucceeded {
			t.Errorf("API probe on %s: phase %s (%v)", n.Name, phase, err)
		}
	}

	// Through the API: nodes carry their own labels.
	for _, n := range c.Nodes() {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range n.Labels {
			if node.Labels[k] != v {
				t.Errorf("node %s label %s = %q, want %q", n.Name, k, node.Labels[k], v)
			}
		}
	}
	if a, b := c.Nodes()[0].Labels["e2e.image-prefetcher.io/pool"], c.Nodes()[1].Labels["e2e.image-prefetcher.io/pool"]; a == b {
		t.Errorf("both nodes have pool label %q", a)
	}

	// Through each node's CRI: the image is present, the container runs.
	for _, n := range c.Nodes() {
		cri, err := n.CRI()
		if err != nil {
			t.Fatal(err)
		}
		st, err := cri.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
		if err != nil || st.Image == nil {
			t.Errorf("%s: image %s not present (err %v)", n.Name, image, err)
		}
		list, err := cri.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
			LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns},
		}})
		if err != nil {
			t.Fatalf("%s: list containers: %v", n.Name, err)
		}
		if len(list.Containers) != 1 || list.Containers[0].Metadata.Name != "main" {
			t.Errorf("%s: running containers in %s = %v, want one named main", n.Name, ns, list.Containers)
		}
		cri.Close()
		// The socket the pod mounted is this node's containerd.
		if _, err := os.Stat(n.CRISocket); err != nil {
			t.Errorf("%s: CRI socket: %v", n.Name, err)
		}
	}
	// The pulls went to the run's registry, under their ghcr.io name.
	if reqs := c.Registry().Requests(registry.Match{Repo: "e2e/smoke", Kind: registry.Manifests}); len(reqs) < 2 {
		t.Errorf("registry saw %d manifest requests for e2e/smoke, want one per node at least", len(reqs))
	}

	// The images `make oci` wrote to out/oci, pushed as they are under
	// their default references, pulled and unpacked by a node's containerd
	// through the CRI, and run.
	cri, err := c.Nodes()[1].CRI()
	if err != nil {
		t.Fatal(err)
	}
	checkOCILayouts(ctx, t, c, cri)
	// Registry faults reach containerd as they would from ghcr.io: a
	// private repository needs the credentials a pull secret for ghcr.io
	// carries, and one failed pull is one registry request.
	reg := c.Registry()
	reg.RequireAuth("private/*", "puller", "pw")
	if err := c.Push(ctx, img, "private/smoke:v1", remote.WithAuth(&authn.Basic{Username: "puller", Password: "pw"})); err != nil {
		t.Fatal(err)
	}
	private := &runtimeapi.ImageSpec{Image: "ghcr.io/private/smoke:v1"}
	if _, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: private}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("pull of a private image without credentials: err = %v, want a 401", err)
	}
	// containerd 1.6 uses the credentials only if ServerAddress is empty or
	// a URL whose host is the registry's ("ghcr.io" alone is ignored).
	for _, addr := range []string{"", "https://ghcr.io"} {
		auth := &runtimeapi.AuthConfig{Username: "puller", Password: "pw", ServerAddress: addr}
		if _, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: private, Auth: auth}); err != nil {
			t.Errorf("pull of a private image with credentials (ServerAddress %q): %v", addr, err)
		}
		if _, err := cri.Images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: private}); err != nil {
			t.Fatal(err)
		}
	}
	flaky := registry.Match{Repo: "e2e/flaky", Kind: registry.Manifests}
	if err := c.Push(ctx, img, "e2e/flaky:v1"); err != nil {
		t.Fatal(err)
	}
	reg.ResetStats()
	reg.Fail(flaky, 503, 2)
	for i := range 3 {
		_, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "ghcr.io/e2e/flaky:v1"}})
		if (i < 2) != (err != nil) {
			t.Errorf("pull %d of the flaky image: err = %v", i+1, err)
		}
	}
	var statuses []int
	for _, r := range reg.Requests(flaky) {
		statuses = append(statuses, r.Status)
	}
	if len(statuses) < 3 || statuses[0] != 503 || statuses[1] != 503 || statuses[2] == 503 {
		t.Errorf("manifest requests for the flaky image answered %v, want 503, 503, then success", statuses)
	}
	reg.ClearFaults()

	// A stalled blob holds a pull until the caller's deadline; the next
	// attempt gets the blob.
	data, err := ociimage.Data(42, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Push(ctx, data, "e2e/stall:v1"); err != nil {
		t.Fatal(err)
	}
	layers, err := data.Layers()
	if err != nil {
		t.Fatal(err)
	}
	layer, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg.Stall(registry.Match{Repo: "e2e/stall", Ref: layer.String()}, 1, 0)
	stalled := &runtimeapi.ImageSpec{Image: "ghcr.io/e2e/stall:v1"}
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = cri.Images.PullImage(sctx, &runtimeapi.PullImageRequest{Image: stalled})
	scancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("pull with a stalled blob: err = %v, want DeadlineExceeded", err)
	}
	if _, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: stalled}); err != nil {
		t.Errorf("pull after the stall: %v", err)
	}
	reg.ClearFaults()
	cri.Close()

	// Restarting a node's containerd keeps the pod running.
	n1 := c.Nodes()[0]
	if err := n1.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPodsRunning(ctx, ns, "app=smoke", 2); err != nil {
		t.Fatal(err)
	}

	// kubectl-style commands run inside the namespace and inside a node.
	if out, err := c.Command(ctx, "sh", "-c", "test -s $KUBECONFIG && ip -4 -o addr show veth0").CombinedOutput(); err != nil || !strings.Contains(string(out), "10.200.0.11") {
		t.Errorf("command in namespace: %v: %s", err, out)
	}
	if out, err := n1.Command(ctx, "sh", "-c", "test -S "+cluster.NodeSocketPath+" && grep -c ghcr.io /etc/hosts").CombinedOutput(); err != nil {
		t.Errorf("command in node: %v: %s", err, out)
	}

	dir := c.Dir
	stopped = true
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// Leftovers covers processes, mounts, cgroups, CNI results, the
	// namespace, the run directory and, unless another run is still using
	// them, the kubelet's sysctls (compared with the values saved at start).
	if left := c.Leftovers(); len(left) > 0 {
		t.Fatalf("teardown left behind:\n  %s", strings.Join(left, "\n  "))
	}
	if now, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || string(now) != string(hostForward) {
		t.Errorf("host net.ipv4.ip_forward changed from %q to %q (%v)", hostForward, now, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "netns")); !os.IsNotExist(err) {
		t.Errorf("network namespace file still there: %v", err)
	}
	for _, p := range []string{"/var/log/containers", "/var/log/pods", "/var/lib/cni", "/var/lib/kubelet", "/etc/cni", "/opt/containerd", "/run/containerd"} {
		if _, err := os.Stat(p); err == nil && !existedBefore[p] {
			t.Errorf("%s exists after the run", p)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// checkOCILayouts pushes out/oci/image-prefetcher and
// out/oci/image-prefetcher-fn, each an image index of linux/amd64 and
// linux/arm64, under the references the function renders (fn/version), has
// the second node's containerd pull them through the CRI (it resolves the
// index to this machine's entry, as on a node of that architecture), and
// checks, from containerd's own image status and from the config
// that was pushed, the entrypoint, user and os/arch the Dockerfiles give
// (the user also as the uid the kubelet sees). Then it runs each image as
// a pod with the argument "version": the entrypoint exists in the
// unpacked snapshot, runs as the image user (runAsNonRoot holds for the
// function) and prints this build's VERSION.
func checkOCILayouts(ctx context.Context, t *testing.T, c *cluster.Cluster, cri *cluster.CRIClient) {
	t.Helper()
	binDir, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(binDir)
	wantVersion, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	node := c.Nodes()[1].Name
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := c.CreateNamespace(ctx, "oci")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		layout, dockerfile, ref string
		uid                     int64
	}{
		{"out/oci/image-prefetcher", "Dockerfile", version.AgentImage(), 0},
		{"out/oci/image-prefetcher-fn", "Dockerfile.fn", version.FunctionImageRepository + ":" + version.Version, 65532},
	} {
		user, entrypoint := dockerfileUserEntrypoint(t, filepath.Join(root, x.dockerfile))
		img, err := ociimage.ReadLayout(filepath.Join(root, x.layout))
		if err != nil {
			t.Fatalf("%v: run `make oci`", err)
		}
		digest, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		idx, err := ociimage.ReadLayoutIndex(filepath.Join(root, x.layout))
		if err != nil {
			t.Fatalf("%v: run `make oci`", err)
		}
		indexDigest, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		repoTag, ok := strings.CutPrefix(x.ref, "ghcr.io/")
		if !ok {
			t.Fatalf("default image %s is not on ghcr.io, which the nodes mirror", x.ref)
		}
		if err := c.PushLayoutIndex(ctx, filepath.Join(root, x.layout), repoTag); err != nil {
			t.Fatal(err)
		}
		// The tag names the index; this platform's entry is the layout's.
		served, err := remote.Index(mustRef(t, cluster.RegistryAddr+"/"+repoTag), remote.WithTransport(c.RegistryTransport()))
		if err != nil {
			t.Fatalf("read back %s: %v", repoTag, err)
		}
		if d, _ := served.Digest(); d != indexDigest {
			t.Errorf("%s: the registry serves index %s, the layout holds %s", repoTag, d, indexDigest)
		}
		pushed, err := remote.Image(mustRef(t, cluster.RegistryAddr+"/"+repoTag), remote.WithTransport(c.RegistryTransport()),
			remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
		if err != nil {
			t.Fatalf("read back %s: %v", repoTag, err)
		}
		if d, _ := pushed.Digest(); d != digest {
			t.Errorf("%s: the registry's linux/%s entry is %s, the layout's is %s", repoTag, runtime.GOARCH, d, digest)
		}
		pcf, err := pushed.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if pcf.Config.User != user || !slices.Equal(pcf.Config.Entrypoint, entrypoint) {
			t.Errorf("%s pushed with user %q entrypoint %q; %s says USER %s ENTRYPOINT %q", x.ref, pcf.Config.User, pcf.Config.Entrypoint, x.dockerfile, user, entrypoint)
		}
		if pcf.OS != "linux" || pcf.Architecture != runtime.GOARCH {
			t.Errorf("%s pushed as %s/%s, want linux/%s", x.ref, pcf.OS, pcf.Architecture, runtime.GOARCH)
		}

		pull, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: x.ref}})
		if err != nil {
			t.Fatalf("pull %s through the CRI: %v", x.ref, err)
		}
		// containerd names an image by its config digest, and records the
		// manifest it came from as the repo digest.
		configDigest, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		if pull.ImageRef != configDigest.String() {
			t.Errorf("%s: containerd pulled image %s, the layout's config is %s", x.ref, pull.ImageRef, configDigest)
		}
		st, err := cri.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: x.ref}, Verbose: true})
		if err != nil || st.Image == nil {
			t.Fatalf("%s not present after pull (err %v)", x.ref, err)
		}
		if !slices.Contains(st.Image.RepoDigests, strings.Split(x.ref, ":")[0]+"@"+indexDigest.String()) {
			t.Errorf("%s: containerd's repo digests %q do not name the layout's image index %s", x.ref, st.Image.RepoDigests, indexDigest)
		}
		if st.Image.Uid == nil || st.Image.Uid.Value != x.uid {
			t.Errorf("%s: containerd reports uid %v, want %d", x.ref, st.Image.Uid, x.uid)
		}
		// containerd's verbose status carries the image config it stored.
		var info struct {
			ImageSpec struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
				Config       struct {
					User       string   `json:"User"`
					Entrypoint []string `json:"Entrypoint"`
				} `json:"config"`
			} `json:"imageSpec"`
		}
		if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
			t.Fatalf("%s: containerd's verbose image status: %v: %q", x.ref, err, st.Info)
		}
		is := info.ImageSpec
		if is.Config.User != user || !slices.Equal(is.Config.Entrypoint, entrypoint) || is.OS != "linux" || is.Architecture != runtime.GOARCH {
			t.Errorf("%s in containerd: user %q entrypoint %q %s/%s; want %q %q linux/%s", x.ref, is.Config.User, is.Config.Entrypoint, is.OS, is.Architecture, user, entrypoint, runtime.GOARCH)
		}

		// Run it: only an unpacked image with a working entrypoint prints
		// the version.
		name := "run-" + path.Base(x.layout)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:      node,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: x.ref, ImagePullPolicy: corev1.PullNever, Args: []string{"version"},
					SecurityContext: &corev1.SecurityContext{RunAsNonRoot: ptr(x.uid != 0)},
				}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		phase, err := waitPodDone(ctx, c, ns, name)
		if err != nil || phase != corev1.PodSucceeded {
			p, _ := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			t.Errorf("%s run with `version`: phase %s (%v); status %+v", x.ref, phase, err, p.Status.ContainerStatuses)
			continue
		}
		// containerd's shim copies the output into the log file on its own:
		// a container can be reported exited before the copy is done (a
		// fresh-clone run read an empty log), so the log is read until it
		// has a line, for at most 15 s.
		var logs []byte
		lctx, lcancel := context.WithTimeout(ctx, 15*time.Second)
		_ = cluster.Poll(lctx, 200*time.Millisecond, "the version in the log", func() (bool, string) {
			logs, err = cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: "main"}).DoRaw(lctx)
			return err == nil && strings.TrimSpace(string(logs)) != "", fmt.Sprintf("log %q (%v)", logs, err)
		})
		lcancel()
		if err != nil || strings.TrimSpace(string(logs)) != strings.TrimSpace(string(wantVersion)) {
			t.Errorf("%s `version` printed %q (%v), want %q", x.ref, logs, err, strings.TrimSpace(string(wantVersion)))
		}
	}
}

// dockerfileUserEntrypoint returns USER and ENTRYPOINT (exec form) of a
// Dockerfile's final stage.
func dockerfileUserEntrypoint(t *testing.T, file string) (user string, entrypoint []string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		cmd, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch strings.ToUpper(cmd) {
		case "FROM":
			user, entrypoint = "", nil
		case "USER":
			user = args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(args), &entrypoint); err != nil {
				t.Fatalf("%s: ENTRYPOINT %s: %v", file, args, err)
			}
		}
	}
	if user == "" || len(entrypoint) == 0 {
		t.Fatalf("%s: no USER or ENTRYPOINT in the final stage", file)
	}
	return user, entrypoint
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitPodDone waits until the pod has succeeded or failed.
func waitPodDone(ctx context.Context, c *cluster.Cluster, ns, name string) (corev1.PodPhase, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
			return p.Status.Phase, nil
		}
		select {
		case <-ctx.Done():
			if p != nil {
				return p.Status.Phase, ctx.Err()
			}
			return "", ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// existedBefore records host paths a cluster could create, before any test.
var existedBefore = func() map[string]bool {
	m := map[string]bool{}
	for _, p := range []string{"/var/log/containers", "/var/log/pods", "/var/lib/cni", "/var/lib/kubelet", "/etc/cni", "/opt/containerd", "/run/containerd"} {
		if _, err := os.Stat(p); err == nil {
			m[p] = true
		}
	}
	return m
}()
