package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Scenario 11: bad input. Render-time mistakes fail the real kustomize
// build with the field path; a list with a BOM, CRLF, duplicates and an
// invalid line still gets every valid image pulled and reports the
// invalid one; a wrong criSocket makes the init container fail with one
// clear line naming the path.
func Test11BadInput(t *testing.T) {
	e := setup(t)
	t.Run("render", func(t *testing.T) {
		for _, tc := range []struct {
			name, inst, spec, want string
		}{
			{"64-character instance name", strings.Repeat("a", 64), yamlList([]string{"ghcr.io/e2e/x:v1"}), "metadata.name"},
			{"uppercase reference", "upper", yamlList([]string{"ghcr.io/E2E/Upper:v1"}), "spec.images[0]"},
			{"unknown field", "unknown", yamlList([]string{"ghcr.io/e2e/x:v1"}) + "  pull:\n    paralelism: 2\n", "spec.pull.paralelism"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := e.kustomization(t, "", instance{Name: tc.inst, Namespace: "e2e-render", Spec: tc.spec})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				out, stderr, err := kustomizeBuild(ctx, dir)
				if err == nil {
					t.Fatalf("kustomize build succeeded, want an error naming %s; output:\n%s", tc.want, out)
				}
				if !strings.Contains(stderr, tc.want) {
					t.Errorf("kustomize build failed without naming %s:\n%s", tc.want, stderr)
				}
				logf(t, "render error: %s", firstLineWith(stderr, tc.want))
			})
		}
	})

	t.Run("messy list", func(t *testing.T) {
		refs := testImages(t, 1300, 64<<10, "messy-a", "messy-b")
		const invalid = "Not::A/valid ref"
		// What a hand-edited ConfigMap (or a list written by another tool)
		// may hold; the function refuses the invalid line at render time,
		// so it is put into the rendered ConfigMap.
		list := "\ufeff# images\r\n" + refs[0] + "\r\n\r\n" + refs[1] + "\r\n" + refs[0] + "\r\n" + invalid + "\r\n"
		in := instance{Name: "messy", Namespace: "e2e-messy", Spec: yamlList(refs)}
		manifests := withImageList(t, e.render(t, in), list)
		d := e.deploy(t, in, manifests)
		for _, n := range c.Nodes() {
			st := e.waitLabel(t, d, n.Name, "failed", labelWait)
			s := st.summary
			if s.Total != 3 || s.Present != 2 || len(s.Failed) != 1 {
				t.Errorf("%s: summary %s, want total 3 (duplicate dropped), present 2, one failure", n.Name, st.annotation)
				continue
			}
			if f := s.Failed[0]; f.Reason != "InvalidReference" || !strings.Contains(f.Image, invalid) {
				t.Errorf("%s: failure %+v, want %q as InvalidReference", n.Name, f, invalid)
			}
		}
		assertImages(t, c.Nodes(), refs, true)
	})

	t.Run("wrong criSocket", func(t *testing.T) {
		refs := testImages(t, 1400, 64<<10, "socket-a")
		const socket = "/run/containerd/wrong.sock"
		spec := yamlList(refs) + "  criSocket: " + socket + "\n"
		d := e.deployInstance(t, instance{Name: "socket", Namespace: "e2e-socket", Spec: spec})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var pod corev1.Pod
		if err := poll(ctx, "a fetch init container that exited 1", func() (bool, string) {
			pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, p := range pods.Items {
				for _, st := range p.Status.InitContainerStatuses {
					term := st.State.Terminated
					if term == nil {
						term = st.LastTerminationState.Terminated
					}
					if st.Name == "fetch" && term != nil && term.ExitCode == 1 {
						pod = p
						return true, ""
					}
				}
			}
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}); err != nil {
			e.dumpPods(t, d.Namespace)
			t.Fatal(err)
		}
		logs, err := e.containerLogs(ctx, pod, "fetch")
		if err != nil {
			t.Fatal(err)
		}
		var naming []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, socket) {
				naming = append(naming, l)
			}
		}
		if len(naming) != 1 || !strings.Contains(naming[0], "CRI socket not found") {
			t.Errorf("fetch logs should have one line naming %s as a missing CRI socket; logs:\n%s", socket, logs)
		} else {
			logf(t, "fetch on %s: %s", pod.Spec.NodeName, naming[0])
		}
		for _, n := range c.Nodes() {
			st, err := e.state(ctx, n.Name, d.key())
			if err != nil {
				t.Fatal(err)
			}
			if st.label != "" {
				t.Errorf("%s is labeled %q although the agent never reached the runtime", n.Name, st.label)
			}
		}
	})
}

// containerLogs returns a container's logs: the current run's, or the last
// terminated run's while the kubelet waits to restart it.
func (e env) containerLogs(ctx context.Context, pod corev1.Pod, container string) (string, error) {
	for _, previous := range []bool{false, true} {
		out, err := e.cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: container, Previous: previous}).DoRaw(ctx)
		if err == nil && len(bytes.TrimSpace(out)) > 0 {
			return string(out), nil
		}
	}
	return "", fmt.Errorf("no logs for %s/%s container %s", pod.Namespace, pod.Name, container)
}

func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// withImageList replaces images.txt of the rendered image-list ConfigMap
// and returns the objects as a JSON stream for Apply.
func withImageList(t *testing.T, manifests []byte, list string) []byte {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var out bytes.Buffer
	replaced := false
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if obj["kind"] == "ConfigMap" {
			data, _ := obj["data"].(map[string]any)
			if _, ok := data["images.txt"]; ok {
				data["images.txt"] = list
				replaced = true
			}
		}
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		out.Write(b)
		out.WriteByte('\n')
	}
	if !replaced {
		t.Fatal("the rendered output has no ConfigMap with images.txt")
	}
	return out.Bytes()
}
