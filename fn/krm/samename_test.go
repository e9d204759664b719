package krm

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
)

// TestSameNameIsAnError: instances of one name share the node key, so two
// of them in one ResourceList are an error naming both, whatever their
// namespaces and in every mode; the items are left as they were.
func TestSameNameIsAnError(t *testing.T) {
	prefetcher := func(ns, name string, kpt bool) string {
		ann := ""
		if kpt {
			ann = "\n    annotations:\n      internal.config.kubernetes.io/path: 'p.yaml'\n      internal.config.kubernetes.io/index: '0'"
		}
		return fmt.Sprintf("- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: %s\n    namespace: %s%s\n  spec:\n    images: [debian:bookworm]\n", name, ns, ann)
	}
	cases := []struct {
		name  string
		items string
		// want are the errors' messages (parts of), one per error.
		want []string
	}{
		{"two namespaces", prefetcher("team-a", "web", false) + prefetcher("team-b", "web", false),
			[]string{"ImagePrefetcher team-b/web has the name of ImagePrefetcher team-a/web: instances of one name share the node label and annotation image-prefetcher.stackrox.io/web"}},
		{"three namespaces", prefetcher("team-a", "web", false) + prefetcher("team-b", "web", false) + prefetcher("team-c", "web", false),
			[]string{"team-b/web has the name of ImagePrefetcher team-a/web", "team-c/web has the name of ImagePrefetcher team-a/web"}},
		{"kpt package", prefetcher("team-a", "web", true) + prefetcher("team-b", "web", true),
			[]string{"team-b/web has the name of ImagePrefetcher team-a/web"}},
		{"same namespace too", prefetcher("team-a", "web", false) + prefetcher("team-a", "web", false),
			[]string{"renders ServiceAccount team-a/image-prefetcher-web, which ImagePrefetcher team-a/web also renders"}},
		{"other names", prefetcher("team-a", "web", false) + prefetcher("team-b", "web-2", false), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + tc.items
			out, results, err := Run([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			var errs []*framework.Result
			for _, r := range results {
				if r.Severity == framework.Error {
					errs = append(errs, r)
				}
			}
			if len(errs) != len(tc.want) {
				t.Fatalf("%d errors, want %d: %v", len(errs), len(tc.want), results)
			}
			for i, r := range errs {
				if !strings.Contains(r.Message, tc.want[i]) || r.Field == nil || r.Field.Path != "metadata.name" || r.ResourceRef == nil {
					t.Errorf("error %d: %+v, want %q at metadata.name", i, r, tc.want[i])
				}
			}
			if len(tc.want) > 0 && strings.Contains(string(out), "kind: DaemonSet") {
				t.Errorf("rendered despite the error:\n%s", out)
			}
		})
	}
}

// TestSameNameAcrossLayers: what a lower kustomize layer rendered carries
// the rendered-for mark; an upper layer that renders an instance of the same
// name in another namespace, or declares the lower layer's instance again
// (which would replace its rendering), or sees two renamed copies of one
// rendering, is refused naming both.
func TestSameNameAcrossLayers(t *testing.T) {
	ip := func(ns string) string {
		return "- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: web\n    namespace: " + ns + "\n  spec:\n    images: [debian:bookworm]\n"
	}
	out, results, err := Run([]byte("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + ip("team-a")))
	if err != nil || results.ExitCode() != 0 {
		t.Fatalf("lower layer: %v %v", err, results)
	}
	lower := string(out)[strings.Index(string(out), "items:\n")+len("items:\n"):]
	if i := strings.Index(lower, "results:\n"); i >= 0 {
		lower = lower[:i]
	}
	renamed := func(prefix string) string {
		return strings.ReplaceAll(lower, "  name: image-prefetcher-web\n", "  name: "+prefix+"image-prefetcher-web\n")
	}
	for _, tc := range []struct{ name, items, want string }{
		{"same name, other namespace", lower + ip("team-b"),
			"ImagePrefetcher team-b/web has the name of ImagePrefetcher team-a/web, which a lower layer rendered (ServiceAccount team-a/image-prefetcher-web carries image-prefetcher.stackrox.io/rendered-for: team-a/web)"},
		{"renamed copies", renamed("a-") + renamed("b-"),
			"DaemonSet team-a/a-image-prefetcher-web and DaemonSet team-a/b-image-prefetcher-web are both what image-prefetcher-fn rendered for ImagePrefetcher team-a/web, renamed after rendering"},
		{"one renamed copy", renamed("a-"), ""},
		{"the same instance again, the same declaration", lower + ip("team-a"), ""},
		{"the same instance again, declared differently", lower + strings.Replace(ip("team-a"), "debian:bookworm", "debian:trixie", 1),
			"ImagePrefetcher team-a/web is declared again: a lower layer rendered ImagePrefetcher team-a/web already (ConfigMap team-a/image-prefetcher-web.images carries image-prefetcher.stackrox.io/rendered-for: team-a/web)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, results, err := Run([]byte("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + tc.items))
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if results.ExitCode() != 0 {
					t.Errorf("refused: %v", results)
				}
				return
			}
			if results.ExitCode() == 0 || !strings.Contains(results.Error(), tc.want) {
				t.Errorf("results %v, want an error with %q", results, tc.want)
			}
			for _, r := range results {
				if r.Severity == framework.Error && (r.Field == nil || r.Field.Path != "metadata.name") {
					t.Errorf("error without the field path metadata.name: %+v", r)
				}
			}
		})
	}
}
