package render

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

func mustConfig(t testing.TB, images []string, mutate func(*v1alpha1.Spec)) Config {
	t.Helper()
	ip := &v1alpha1.ImagePrefetcher{
		APIVersion: v1alpha1.APIVersion,
		Kind:       v1alpha1.Kind,
		Spec:       v1alpha1.Spec{Images: images},
	}
	ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
	if mutate != nil {
		mutate(&ip.Spec)
	}
	c, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		t.Fatalf("unexpected problems: %+v", probs)
	}
	return c
}

// TestHashRolls: the pod-template hash changes with the list and with any
// setting that reaches the pods, and only then.
func TestHashRolls(t *testing.T) {
	baseConfig := mustConfig(t, []string{"debian:12", "busybox:1"}, nil)
	base := baseConfig.Hash()
	if again := mustConfig(t, []string{"debian:12", "busybox:1"}, nil).Hash(); again != base {
		t.Errorf("same input, different hash: %s vs %s", base, again)
	}
	// A later spelling of the same image is dropped as a duplicate, and
	// "busybox" is what the kubelet sends as "busybox:latest".
	if same := mustConfig(t, []string{"debian:12", "busybox:1", "docker.io/library/debian:12"}, nil).Hash(); same != base {
		t.Errorf("a list with a normalized-equal duplicate hashes differently")
	}
	if a, b := mustConfig(t, []string{"busybox"}, nil).Hash(), mustConfig(t, []string{"busybox:latest"}, nil).Hash(); a != b {
		t.Errorf("busybox and busybox:latest hash differently")
	}
	two, off, three := int32(2), false, intstr.FromInt32(3)
	for name, c := range map[string]Config{
		"image added":   mustConfig(t, []string{"debian:12", "busybox:1", "alpine:3"}, nil),
		"image removed": mustConfig(t, []string{"debian:12"}, nil),
		"order changed": mustConfig(t, []string{"busybox:1", "debian:12"}, nil),
		"parallelism":   mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Pull.Parallelism = &two }),
		"pull policy":   mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Pull.Policy = v1alpha1.PullAlways }),
		"pull secret":   mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.ImagePullSecrets = []string{"creds"} }),
		"refresh":       mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.RefreshInterval = "1h" }),
		"agent image":   mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Agent.Image = "example.com/agent:1" }),
		"timeout":       mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Pull.OverallTimeout = "1h" }),
		"node selector": mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.NodeSelector = map[string]string{"a": "b"} }),
		"flavor":        mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Flavor = v1alpha1.FlavorOCP }),
		"node label":    mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.NodeLabel.Enabled = &off }),
	} {
		if c.Hash() == base {
			t.Errorf("%s: hash did not change", name)
		}
	}
	// Settings outside the pod template must not roll the pods: the
	// DaemonSet controller applies a new update strategy without a new
	// revision, and the admission policy is a separate object.
	for name, c := range map[string]Config{
		"max unavailable":  mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Rollout.MaxUnavailable = &three }),
		"admission policy": mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.AdmissionPolicy = &off }),
	} {
		if c.Hash() != base {
			t.Errorf("%s: hash changed; the pods would roll for a setting they do not see", name)
		}
		if got, want := daemonSetField(t, c, "spec", "template"), daemonSetField(t, baseConfig, "spec", "template"); got != want {
			t.Errorf("%s: pod template changed:\n%s\nwant\n%s", name, got, want)
		}
	}
	// The strategy itself does change.
	mu := mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Rollout.MaxUnavailable = &three })
	if got := daemonSetField(t, mu, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"); got != "3\n" {
		t.Errorf("maxUnavailable rendered as %q, want 3", got)
	}
}

// daemonSetField renders c and returns one field of its DaemonSet as YAML.
func daemonSetField(t *testing.T, c Config, path ...string) string {
	t.Helper()
	objs, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			f, err := o.Pipe(yaml.Lookup(path...))
			if err != nil || f == nil {
				t.Fatalf("DaemonSet has no %v: %v", path, err)
			}
			return f.MustString()
		}
	}
	t.Fatal("no DaemonSet rendered")
	return ""
}

// TestNamesDoNotCollide: cluster-scoped names include the namespace with a
// separator that neither namespaces nor instance names can contain.
func TestNamesDoNotCollide(t *testing.T) {
	pairs := [][2]string{{"a-b", "c"}, {"a", "b-c"}, {"a", "c"}, {"b", "c"}, {"a", "a"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		for _, name := range []string{NamesFor(p[0], p[1]).Cluster, p[0] + "/" + NamesFor(p[0], p[1]).Namespaced} {
			if prev, ok := seen[name]; ok {
				t.Errorf("%v and %v both get %q", prev, p, name)
			}
			seen[name] = p
		}
	}
}

func TestImageListKeepsOrderAndDropsDuplicates(t *testing.T) {
	c := mustConfig(t, []string{"quay.io/a/b:1", "debian", "docker.io/library/debian:latest", "alpine@sha256:" + strings.Repeat("a", 64)}, nil)
	// As the kubelet sends them: ":latest" added, short names kept.
	want := "quay.io/a/b:1\ndebian:latest\nalpine@sha256:" + strings.Repeat("a", 64) + "\n"
	if got := c.ImageListText(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func images(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("registry.example.com/team-%d/app-%d:v1.%d.0", i%37, i, i%11)
	}
	return out
}

// BenchmarkRenderObjects is validation and rendering alone, 2,000 images.
func BenchmarkRenderObjects(b *testing.B) {
	imgs := images(2000)
	for b.Loop() {
		c := mustConfig(b, imgs, nil)
		if _, err := Render(c); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDurationFieldsAreKnown: every duration field of the API is in
// durationFields, so each accepts an unquoted 0 and explains a bare number.
func TestDurationFieldsAreKnown(t *testing.T) {
	known := map[string]bool{}
	for _, fp := range durationFields {
		known[strings.Join(fp, ".")] = true
	}
	var walk func(rt reflect.Type, path string)
	walk = func(rt reflect.Type, path string) {
		for name, ft := range jsonFields(rt) {
			p := path + "." + name
			if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct {
				ft = ft.Elem()
			}
			switch {
			case ft.Kind() == reflect.Struct && ft.PkgPath() == rt.PkgPath():
				walk(ft, p)
			case ft.Kind() == reflect.String && (strings.HasSuffix(name, "Timeout") || strings.HasSuffix(name, "Delay") || strings.HasSuffix(name, "Interval") || strings.HasSuffix(name, "Wait")):
				if !known[p] {
					t.Errorf("%s looks like a duration but is not in durationFields", p)
				}
				delete(known, p)
			}
		}
	}
	walk(reflect.TypeFor[v1alpha1.Spec](), "spec")
	for p := range known {
		t.Errorf("durationFields lists %s, which the API does not have", p)
	}
}
