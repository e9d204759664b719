// Package demo deploys an example the way `make demo` does: render it
// unchanged with the standalone kustomize and the function from ./bin, push
// a stand-in image for every listed image the cluster cannot fetch (it has
// no way out to the Internet), apply the output with the cluster's kubectl,
// and wait for every node to be labeled.
//
// The demo command (tests/cluster/cmd/demo) and the e2e scenario that
// deploys examples/quickstart (tests/e2e) both call Deploy, so a change
// that breaks the demo's path fails `make e2e`, not only `make demo`.
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/ociimage"
)

// Options say what to deploy and where progress goes.
type Options struct {
	// BinDir holds kustomize and image-prefetcher-fn; it is put first on
	// PATH for kustomize, as the example's README says.
	BinDir string
	// Example is the kustomization directory, rendered unchanged.
	Example string
	// AgentRef is the agent image, already pushed; no stand-in replaces it.
	AgentRef string
	// Timeout bounds the wait for every node to be labeled.
	Timeout time.Duration
	// Out receives kubectl apply's output. Default io.Discard.
	Out io.Writer
	// Progress receives one line per step. Default: nothing.
	Progress func(format string, args ...any)
}

// Deployment is what Deploy rendered, pushed and applied.
type Deployment struct {
	// Rendered is kustomize's output, as applied.
	Rendered []byte
	// Objects are the rendered objects, in order.
	Objects []*unstructured.Unstructured
	// Instance and Namespace are the ImagePrefetcher's, read from the
	// rendered DaemonSet.
	Instance, Namespace string
	// Images is the rendered image list.
	Images []string
	// StandIns are the images pushed as stand-ins, normalized and sorted.
	StandIns []string
	// Key is the node label and annotation key of the instance.
	Key string
	// Selector is the rendered DaemonSet's nodeSelector: the nodes it runs
	// on, the ones Deploy waits for.
	Selector string
	// Labeled is "node=value" for every selected node once all are
	// labeled.
	Labeled []string
}

// Deploy renders opts.Example, pushes stand-ins, applies the output and
// waits until every node the DaemonSet selects carries the instance's
// label. On error the returned Deployment holds what was done so far (its
// Objects are set once rendering succeeded), for clean-up.
func Deploy(ctx context.Context, c *cluster.Cluster, opts Options) (*Deployment, error) {
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.Progress == nil {
		opts.Progress = func(string, ...any) {}
	}
	d := &Deployment{}
	opts.Progress("rendering %s: kustomize build --enable-alpha-plugins --enable-exec .", relPath(opts.Example))
	rendered, err := Render(ctx, opts.BinDir, opts.Example)
	if err != nil {
		return d, err
	}
	d.Rendered = rendered
	if d.Objects, err = Decode(rendered); err != nil {
		return d, err
	}
	if d.Instance, d.Namespace, d.Images, err = Describe(d.Objects); err != nil {
		return d, err
	}
	d.Key = v1alpha1.LabelDomain + "/" + d.Instance
	d.Selector = NodeSelector(d.Objects)
	if d.StandIns, err = PushStandIns(ctx, c, d.Images, opts.AgentRef); err != nil {
		return d, err
	}
	if len(d.StandIns) > 0 {
		opts.Progress("pushed small runnable stand-in images (this cluster has no Internet) as %s", strings.Join(d.StandIns, ", "))
	}
	opts.Progress("applying it: kubectl apply --server-side -f -")
	if err := Apply(ctx, c, rendered, opts.Out); err != nil {
		return d, err
	}
	opts.Progress("waiting up to %s for every node (%s) to carry the label %s", opts.Timeout, d.Selector, d.Key)
	d.Labeled, err = WaitLabeled(ctx, c, d.Namespace, d.Key, d.Selector, opts.Timeout, opts.Progress)
	return d, err
}

func relPath(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return "./" + r
		}
	}
	return p
}

// Render runs the standalone kustomize from the example's directory, as
// the example's README does; image-prefetcher-fn is found on PATH.
func Render(ctx context.Context, binDir, example string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kustomize"), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	cmd.Dir = example
	cmd.Env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kustomize build in %s: %w: %s", example, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Decode splits a rendered YAML stream into objects.
func Decode(manifests []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("decode rendered manifests: %w", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// Describe finds the instance name (the DaemonSet's INSTANCE_NAME), its
// namespace and the image list in the rendered output.
func Describe(objs []*unstructured.Unstructured) (instance, namespace string, images []string, err error) {
	var listText string
	for _, o := range objs {
		switch o.GetKind() {
		case "DaemonSet":
			namespace = o.GetNamespace()
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				env, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
				for _, e := range env {
					em := e.(map[string]any)
					if em["name"] == "INSTANCE_NAME" {
						instance, _ = em["value"].(string)
					}
				}
			}
		case "ConfigMap":
			if s, ok, _ := unstructured.NestedString(o.Object, "data", "images.txt"); ok {
				listText = s
			}
		}
	}
	if instance == "" || namespace == "" {
		return "", "", nil, errors.New("the rendered output has no DaemonSet with an INSTANCE_NAME env var")
	}
	if listText == "" {
		return "", "", nil, errors.New("the rendered output has no image-list ConfigMap (key images.txt)")
	}
	list := imagelist.Parse(listText)
	for _, e := range list.Invalid() {
		return "", "", nil, fmt.Errorf("rendered image list: %w", e.Err)
	}
	return instance, namespace, list.Refs(), nil
}

// NodeSelector is the rendered DaemonSet's nodeSelector, as a label
// selector ("" selects every node).
func NodeSelector(objs []*unstructured.Unstructured) string {
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "spec", "nodeSelector")
			return labels.SelectorFromSet(sel).String()
		}
	}
	return ""
}

// PushStandIns gives every listed image except the pause image and the
// agent a small image under that name: the cluster has no way out to
// docker.io, but its containerd resolves docker.io, ghcr.io,
// registry.k8s.io, ... to the run's own registry. It returns the
// normalized names it pushed, sorted.
func PushStandIns(ctx context.Context, c *cluster.Cluster, images []string, agentRef string) ([]string, error) {
	var names []string
	for i, ref := range images {
		full, err := imagelist.Normalize(ref)
		if err != nil {
			return nil, err
		}
		if full == cluster.PauseImage || full == agentRef {
			continue
		}
		host, err := imagelist.Host(full)
		if err != nil {
			return nil, err
		}
		repoTag, ok := strings.CutPrefix(full, host+"/")
		if !ok || !mirrored(host) || strings.Contains(repoTag, "@") {
			return nil, fmt.Errorf("image %s: the cluster's registry serves only tagged images on %s", ref, strings.Join(cluster.MirroredHosts, ", "))
		}
		img, err := StandIn(ctx, full, int64(i))
		if err != nil {
			return nil, err
		}
		if err := c.Push(ctx, img, repoTag); err != nil {
			return nil, fmt.Errorf("push stand-in for %s: %w", ref, err)
		}
		names = append(names, full)
	}
	sort.Strings(names)
	return names, nil
}

// StandIn is a small runnable image named for ref: the harness's pause
// binary (it sleeps until SIGTERM) and 2 MB of data that differ per image,
// so that a workload using the prefetched label can really run.
func StandIn(ctx context.Context, ref string, seed int64) (v1.Image, error) {
	pause, err := cluster.PauseBinary(ctx)
	if err != nil {
		return nil, fmt.Errorf("stand-in for %s: %w", ref, err)
	}
	data := make([]byte, 2<<20)
	_, _ = rand.New(rand.NewSource(1000 + seed)).Read(data)
	spec := ociimage.Binary(pause, "65534:65534")
	spec.Files = append(spec.Files, ociimage.File{Path: "/usr/share/stand-in/data.bin", Data: data, Mode: 0o644})
	spec.Labels = map[string]string{"org.opencontainers.image.description": "image-prefetcher demo stand-in for " + ref}
	img, err := ociimage.Build(spec)
	if err != nil {
		return nil, fmt.Errorf("stand-in for %s: %w", ref, err)
	}
	return img, nil
}

func mirrored(host string) bool {
	for _, h := range cluster.MirroredHosts {
		if h == host {
			return true
		}
	}
	return false
}

// Apply applies rendered with the cluster's kubectl, server-side, inside
// its network namespace, writing kubectl's output to out.
func Apply(ctx context.Context, c *cluster.Cluster, rendered []byte, out io.Writer) error {
	apply := c.Command(ctx, "kubectl", "apply", "--server-side", "--force-conflicts", "-f", "-")
	var stderr bytes.Buffer
	apply.Stdin, apply.Stdout, apply.Stderr = bytes.NewReader(rendered), out, io.MultiWriter(out, &stderr)
	if err := apply.Run(); err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// WaitLabeled polls until every node that selector selects has the label
// key, reporting progress every 10 s, and returns "node=value" for each.
// On timeout it says which nodes lack it and what the pods of namespace
// are doing.
func WaitLabeled(ctx context.Context, c *cluster.Cluster, namespace, key, selector string, timeout time.Duration,
	progress func(string, ...any)) ([]string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	lastReport := start
	var missing []string
	var pods string
	for {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			missing = missing[:0]
			var done []string
			for _, n := range nodes.Items {
				if v, ok := n.Labels[key]; ok {
					done = append(done, n.Name+"="+v)
				} else {
					missing = append(missing, n.Name)
				}
			}
			if len(nodes.Items) > 0 && len(missing) == 0 {
				progress("every node is labeled after %s: %s", time.Since(start).Round(time.Second), strings.Join(done, ", "))
				return done, nil
			}
		}
		pods = podSummary(ctx, c, namespace)
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			progress("still waiting (%s): not labeled yet: %s; pods: %s", time.Since(start).Round(time.Second), strings.Join(missing, ", "), pods)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("after %s, nodes %s still have no label %s (pods in %s: %s); see `kubectl describe pods -n %s` and the component logs in %s/logs",
				timeout, strings.Join(missing, ", "), key, namespace, pods, namespace, c.Dir)
		case <-time.After(2 * time.Second):
		}
	}
}

func podSummary(ctx context.Context, c *cluster.Cluster, namespace string) string {
	cs, err := c.Clientset()
	if err != nil {
		return err.Error()
	}
	list, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	if len(list.Items) == 0 {
		return "none yet"
	}
	var out []string
	for _, p := range list.Items {
		out = append(out, fmt.Sprintf("%s on %s %s", p.Name, p.Spec.NodeName, podState(p)))
	}
	return strings.Join(out, ", ")
}

// podState is roughly what kubectl's STATUS column says.
func podState(p corev1.Pod) string {
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" {
			return w.Reason
		}
		if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("%s (exit %d)", t.Reason, t.ExitCode)
		}
	}
	return string(p.Status.Phase)
}
