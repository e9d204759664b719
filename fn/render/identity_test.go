package render

import (
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// identityOf renders instance name in namespace ns with a startup taint
// and returns its ClusterRole's marker name and its policy's first match
// condition.
func identityOf(t *testing.T, ns, name string) (marker, match string) {
	t.Helper()
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind,
		Spec: v1alpha1.Spec{Images: []string{"debian:12"}, StartupTaint: &v1alpha1.StartupTaint{Key: "example.com/warming"}}}
	ip.Metadata.Name, ip.Metadata.Namespace = name, ns
	c, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		t.Fatal(probs)
	}
	objs, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			rules, _ := o.Pipe(yaml.Lookup("rules"))
			for _, r := range rules.Content() {
				if res := yaml.NewRNode(r).Field("resources"); res != nil && strings.Contains(res.Value.MustString(), MarkerResource) {
					marker = yaml.NewRNode(r).Field("resourceNames").Value.YNode().Content[0].Value
				}
			}
		case "ValidatingAdmissionPolicy":
			v, err := o.Pipe(yaml.Lookup("spec", "matchConditions", "[name=is-image-prefetcher-agent]", "expression"))
			if err != nil || v == nil {
				t.Fatalf("no match condition: %v", err)
			}
			match = v.YNode().Value
		}
	}
	if marker == "" || match == "" {
		t.Fatalf("%s/%s: marker %q, match %q", ns, name, marker, match)
	}
	return marker, match
}

// TestIdentityIsNamespaceAndName: two instances of one name in two
// namespaces, rendered apart, get marks and policies of their own, so that
// one's policy never matches the other's agent (issue 26, finding 1: the
// policy of team-b/web, without a startup taint, denied team-a/web's
// agent its taint removal).
func TestIdentityIsNamespaceAndName(t *testing.T) {
	markA, matchA := identityOf(t, "team-a", "web")
	markB, matchB := identityOf(t, "team-b", "web")
	if markA == markB {
		t.Errorf("team-a/web and team-b/web share the mark %q", markA)
	}
	if matchA == matchB {
		t.Errorf("team-a/web and team-b/web's policies match the same agents: %s", matchA)
	}
	if !strings.Contains(matchA, markA) || strings.Contains(matchA, markB) {
		t.Errorf("team-a's policy %q does not match its own mark %q alone", matchA, markA)
	}
}

// The pod template carries the digest the agent computes from the list it
// reads: the rendered ConfigMap's text, parsed by the same rules.
func TestListDigestAnnotation(t *testing.T) {
	c := mustConfig(t, []string{"debian:12", "busybox", "quay.io/x/y@sha256:" + strings.Repeat("a", 64)}, nil)
	objs, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	var text, digest string
	for _, o := range objs {
		switch o.GetKind() {
		case "ConfigMap":
			text = o.GetDataMap()[v1alpha1.ImageListKey]
		case "DaemonSet":
			v, _ := o.Pipe(yaml.Lookup("spec", "template", "metadata", "annotations", v1alpha1.ListDigestAnnotation))
			if v != nil {
				digest = v.YNode().Value
			}
		}
	}
	if want := imagelist.Parse(text).Digest(); digest != want || len(digest) != 16 {
		t.Errorf("template digest %q, want %q (the digest of the rendered list)", digest, want)
	}
	if other := mustConfig(t, []string{"debian:12"}, nil); imagelist.Parse(other.ImageListText()).Digest() == digest {
		t.Error("another list, the same digest")
	}
}
