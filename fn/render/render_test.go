package render

import (
	"fmt"
	"strings"
	"testing"

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
	if probs.HasErrors() {
		t.Fatalf("unexpected problems: %+v", probs)
	}
	return c
}

// TestHashRolls: the pod-template hash changes with the list and with any
// setting, and only then.
func TestHashRolls(t *testing.T) {
	base := mustConfig(t, []string{"debian:12", "busybox:1"}, nil).Hash()
	if again := mustConfig(t, []string{"debian:12", "busybox:1"}, nil).Hash(); again != base {
		t.Errorf("same input, different hash: %s vs %s", base, again)
	}
	// Spellings the kubelet treats as the same image give the same hash.
	if same := mustConfig(t, []string{"docker.io/library/debian:12", "busybox:1", "debian:12"}, nil).Hash(); same != base {
		t.Errorf("normalized-equal lists hash differently")
	}
	two := int32(2)
	for name, c := range map[string]Config{
		"image added":     mustConfig(t, []string{"debian:12", "busybox:1", "alpine:3"}, nil),
		"image removed":   mustConfig(t, []string{"debian:12"}, nil),
		"order changed":   mustConfig(t, []string{"busybox:1", "debian:12"}, nil),
		"parallelism":     mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Pull.Parallelism = &two }),
		"pull policy":     mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Pull.Policy = v1alpha1.PullAlways }),
		"pull secret":     mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.ImagePullSecrets = []string{"creds"} }),
		"refresh":         mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.RefreshInterval = "1h" }),
		"agent image":     mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Agent.Image = "example.com/agent:1" }),
		"timeout":         mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Pull.OverallTimeout = "1h" }),
		"node selector":   mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.NodeSelector = map[string]string{"a": "b"} }),
		"max unavailable": mustConfig(t, []string{"debian:12", "busybox:1"}, func(s *v1alpha1.Spec) { s.Flavor = v1alpha1.FlavorOCP }),
	} {
		if c.Hash() == base {
			t.Errorf("%s: hash did not change", name)
		}
	}
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
	want := "quay.io/a/b:1\ndocker.io/library/debian:latest\ndocker.io/library/alpine@sha256:" + strings.Repeat("a", 64) + "\n"
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
