package krm

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// kptIP is an ImagePrefetcher item as kpt passes it: with its file and
// kpt's seqindent mark.
func kptIP(ns, name, file string) string {
	return fmt.Sprintf(`- apiVersion: image-prefetcher.stackrox.io/v1alpha1
  kind: ImagePrefetcher
  metadata:
    name: %s
    namespace: %s
    annotations:
      config.kubernetes.io/local-config: "true"
      internal.config.kubernetes.io/path: '%s'
      internal.config.kubernetes.io/index: '0'
      internal.config.kubernetes.io/seqindent: 'compact'
  spec:
    images: [debian:bookworm]
`, name, ns, file)
}

// kustomizeIP is an ImagePrefetcher item as kustomize passes it to a
// transformer: with kustomize's id and an index, in both forms (kustomize
// v5.8.2 numbers the items; one index is enough here).
func kustomizeIP(ns, name string) string {
	return fmt.Sprintf(`- apiVersion: image-prefetcher.stackrox.io/v1alpha1
  kind: ImagePrefetcher
  metadata:
    name: %[1]s
    namespace: %[2]s
    annotations:
      kustomize.config.k8s.io/id: |
        group: image-prefetcher.stackrox.io
        kind: ImagePrefetcher
        name: %[1]s
        namespace: %[2]s
        version: v1alpha1
      config.kubernetes.io/index: '0'
      internal.config.kubernetes.io/index: '0'
  spec:
    images: [debian:bookworm]
`, name, ns)
}

func resourceList(items string, fc string) []byte {
	s := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + items
	if fc != "" {
		s += "functionConfig:\n" + fc
	}
	return []byte(s)
}

// rendered runs the function and returns the output items, without the
// results, as the next run's input.
func rendered(t *testing.T, in []byte) string {
	t.Helper()
	out, results, err := Run(in)
	if err != nil {
		t.Fatal(err)
	}
	if results.ExitCode() != 0 {
		t.Fatalf("error results: %v", results)
	}
	s := string(out)
	s = s[strings.Index(s, "items:\n")+len("items:\n"):]
	for _, cut := range []string{"\nfunctionConfig:\n", "\nresults:\n"} {
		if i := strings.Index(s, cut); i >= 0 {
			s = s[:i+1]
		}
	}
	return s
}

// summary lists the output's objects as "Kind namespace/name <- owner @ file".
func summary(t *testing.T, out []byte) []string {
	t.Helper()
	rl, err := fn.ParseResourceList(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range rl.Items {
		s := it.GetKind() + " " + strings.TrimPrefix(it.GetNamespace()+"/"+it.GetName(), "/")
		if o := it.GetAnnotation(RenderedForAnnotation); o != "" {
			s += " <- " + o
		}
		if p := it.PathAnnotation(); p != "" {
			s += " @ " + p
		}
		got = append(got, s)
	}
	return got
}

// objects of one instance's default rendering, in order.
func objectsOf(ns, name, file string) []string {
	n := "image-prefetcher-" + name
	c := "image-prefetcher." + ns + "." + name
	tail := " <- " + ns + "/" + name
	if file != "" {
		tail += " @ " + file
	}
	var out []string
	for _, o := range []string{"ServiceAccount " + ns + "/" + n, "ClusterRole " + c, "ClusterRoleBinding " + c, "Role " + ns + "/" + n, "RoleBinding " + ns + "/" + n,
		"ConfigMap " + ns + "/" + n + ".images", "DaemonSet " + ns + "/" + n, "ValidatingAdmissionPolicy " + c, "ValidatingAdmissionPolicyBinding " + c} {
		out = append(out, o+tail)
	}
	return out
}

func TestOwnership(t *testing.T) {
	kptWeb := kptIP("prefetch", "web", "p.yaml")
	cases := []struct {
		name string
		// earlier is the input of a first run; its output, with edit
		// applied, is the input of the run under test.
		earlier []byte
		edit    func(string) string
		fc      string
		want    []string
		// wantError is in the message of an error result; the items are
		// then the input's.
		wantError string
		// wantInfo is the message of an info or warning result.
		wantInfo string
		// images maps a ConfigMap's name to a reference its list must hold.
		images map[string]string
	}{
		{
			name:    "kpt: a renamed instance leaves nothing of its old name",
			earlier: resourceList(kptWeb, ""),
			edit:    func(s string) string { return strings.Replace(s, "name: web\n", "name: web2\n", 1) },
			want:    append([]string{"ImagePrefetcher prefetch/web2 @ p.yaml"}, objectsOf("prefetch", "web2", "image-prefetcher.prefetch.web2.yaml")...),
			wantInfo: "removed what image-prefetcher-fn rendered earlier for ImagePrefetcher prefetch/web, which is no longer in the package: " +
				"ClusterRole image-prefetcher.prefetch.web, ClusterRoleBinding image-prefetcher.prefetch.web, ConfigMap prefetch/image-prefetcher-web.images, DaemonSet prefetch/image-prefetcher-web, " +
				"Role prefetch/image-prefetcher-web, RoleBinding prefetch/image-prefetcher-web, ServiceAccount prefetch/image-prefetcher-web, " +
				"ValidatingAdmissionPolicy image-prefetcher.prefetch.web, ValidatingAdmissionPolicyBinding image-prefetcher.prefetch.web",
		},
		{
			name:    "kpt: admission policy off removes the policy and its binding",
			earlier: resourceList(kptWeb, ""),
			edit: func(s string) string {
				return strings.Replace(s, "  spec:\n    images:", "  spec:\n    admissionPolicy: false\n    images:", 1)
			},
			want:     append([]string{"ImagePrefetcher prefetch/web @ p.yaml"}, objectsOf("prefetch", "web", "image-prefetcher.prefetch.web.yaml")[:7]...),
			wantInfo: "removed what image-prefetcher-fn rendered earlier for this instance and no longer renders: ValidatingAdmissionPolicy image-prefetcher.prefetch.web, ValidatingAdmissionPolicyBinding image-prefetcher.prefetch.web",
		},
		{
			name:    "kpt: the last instance removed takes its objects along",
			earlier: resourceList(kptWeb+"- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: prefetch\n    annotations:\n      internal.config.kubernetes.io/path: 'ns.yaml'\n      internal.config.kubernetes.io/seqindent: 'compact'\n", ""),
			edit: func(s string) string {
				return s[strings.Index(s, "- apiVersion: v1\n  kind: Namespace"):]
			},
			want: []string{"Namespace prefetch @ ns.yaml"},
		},
		{
			name:    "kpt configPath: another instance's intent and objects are not this step's",
			earlier: resourceList(kptWeb+kptIP("prefetch", "api", "api.yaml"), ""),
			fc:      "  " + strings.TrimPrefix(strings.Replace(kptIP("prefetch", "web", "p.yaml"), "debian:bookworm", "busybox", 1), "- "),
			edit:    func(s string) string { return strings.ReplaceAll(s, "images: [debian:bookworm]", "images: [busybox]") },
			// web's new list; api keeps what it rendered before its edit.
			images: map[string]string{"image-prefetcher-web": "busybox", "image-prefetcher-api": "debian:bookworm"},
			want: slices.Concat([]string{"ImagePrefetcher prefetch/web @ p.yaml"}, objectsOf("prefetch", "web", "image-prefetcher.prefetch.web.yaml"),
				[]string{"ImagePrefetcher prefetch/api @ api.yaml"}, objectsOf("prefetch", "api", "image-prefetcher.prefetch.api.yaml")),
		},
		{
			name:      "kpt: a user file with the name of the function's output file",
			earlier:   resourceList(kptWeb+"- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: mine\n    namespace: prefetch\n    annotations:\n      internal.config.kubernetes.io/path: 'image-prefetcher.prefetch.web.yaml'\n      internal.config.kubernetes.io/seqindent: 'compact'\n", ""),
			wantError: `image-prefetcher-fn writes what this instance renders to "image-prefetcher.prefetch.web.yaml", but that file holds ConfigMap prefetch/mine, which the function did not render`,
		},
		{
			name:      "kpt: an intent in the file named for its output",
			earlier:   resourceList(kptIP("prefetch", "web", "image-prefetcher.prefetch.web.yaml"), ""),
			wantError: `image-prefetcher-fn writes what this instance renders to "image-prefetcher.prefetch.web.yaml", but that file holds ImagePrefetcher prefetch/web, which the function did not render`,
		},
		{
			// Output of a release before the mark: the function's labels
			// in the file named for the instance.
			name:    "kpt: unmarked objects of an earlier release in the instance's file",
			earlier: resourceList(kptWeb, ""),
			edit: func(s string) string {
				s = strings.ReplaceAll(s, "      image-prefetcher.stackrox.io/rendered-for: 'prefetch/web'\n", "")
				return strings.Replace(s, "name: web\n", "name: web2\n", 1)
			},
			want: append([]string{"ImagePrefetcher prefetch/web2 @ p.yaml"}, objectsOf("prefetch", "web2", "image-prefetcher.prefetch.web2.yaml")...),
		},
		{
			name:    "kpt: an intent without local-config stays and gets the mark",
			earlier: resourceList(strings.Replace(kptWeb, "      config.kubernetes.io/local-config: \"true\"\n", "", 1), ""),
			want:    append([]string{"ImagePrefetcher prefetch/web @ p.yaml"}, objectsOf("prefetch", "web", "image-prefetcher.prefetch.web.yaml")...),
		},
		{
			name:     "kpt: an intent marked local-config \"false\" stays as it is, with a warning",
			earlier:  resourceList(strings.Replace(kptWeb, `local-config: "true"`, `local-config: "false"`, 1), ""),
			want:     append([]string{"ImagePrefetcher prefetch/web @ p.yaml"}, objectsOf("prefetch", "web", "image-prefetcher.prefetch.web.yaml")...),
			wantInfo: `is "false": the ImagePrefetcher stays in the package as its intent, and kpt live apply would send it to a cluster that has no such API; set it to "true"`,
		},
		{
			// kustomize layering: a lower kustomization rendered "a" and
			// consumed its ImagePrefetcher; an upper one renders "b".
			name:    "kustomize: objects of an instance rendered below are neither pruned nor rendered again",
			earlier: resourceList(kustomizeIP("prefetch", "a"), ""),
			edit: func(s string) string {
				return strings.ReplaceAll(s, "    annotations:\n      image-prefetcher.stackrox.io/rendered-for", "    annotations:\n      kustomize.config.k8s.io/id: x\n      image-prefetcher.stackrox.io/rendered-for") + kustomizeIP("prefetch", "b")
			},
			want: slices.Concat(objectsOf("prefetch", "a", "image-prefetcher.prefetch.a.yaml"), objectsOf("prefetch", "b", "image-prefetcher.prefetch.b.yaml")),
		},
		{
			name:      "an object of the same name the function did not render",
			earlier:   resourceList(kptWeb+"- apiVersion: v1\n  kind: ServiceAccount\n  metadata:\n    name: image-prefetcher-web\n    namespace: prefetch\n    annotations:\n      internal.config.kubernetes.io/path: 'sa.yaml'\n", ""),
			wantError: "renders ServiceAccount prefetch/image-prefetcher-web, which already exists in the input and was not rendered by this function",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.earlier
			if tc.edit != nil {
				in = resourceList(tc.edit(rendered(t, tc.earlier)), tc.fc)
			} else if tc.fc != "" {
				in = append(in, []byte("functionConfig:\n"+tc.fc)...)
			}
			out, results, err := Run(in)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantError != "" {
				if results.ExitCode() == 0 || !strings.Contains(results.Error(), tc.wantError) {
					t.Fatalf("results %v, want an error with %q", results, tc.wantError)
				}
				if !slices.Equal(summary(t, out), summary(t, in)) {
					t.Errorf("an error changed the items:\n%s", out)
				}
				return
			}
			if results.ExitCode() != 0 {
				t.Fatalf("error results: %v", results)
			}
			if got := summary(t, out); !slices.Equal(got, tc.want) {
				t.Errorf("items:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if tc.wantInfo != "" {
				found := false
				for _, r := range results {
					found = found || r.Severity != framework.Error && r.Message == tc.wantInfo
				}
				if !found {
					t.Errorf("no info result %q in %v", tc.wantInfo, results)
				}
			}
			// Every intent that stays is local-config.
			rl, _ := fn.ParseResourceList(out)
			for _, it := range rl.Items {
				if it.GetKind() == "ImagePrefetcher" && it.GetAnnotation(localConfig) == "" {
					t.Errorf("ImagePrefetcher %s kept without local-config", it.GetName())
				}
				if want, ok := tc.images[it.GetName()]; ok && it.GetKind() == "ConfigMap" {
					if list, _, _ := it.NestedString("data", "images.txt"); !strings.Contains(list, want) {
						t.Errorf("ConfigMap %s lists %q, want %s in it", it.GetName(), list, want)
					}
				}
			}
			// A second run on the output is a fixed point.
			first := rendered(t, in)
			if second := rendered(t, resourceList(first, tc.fc)); second != first {
				t.Errorf("a second run changed the output")
			}
		})
	}
}

func TestInvokedBy(t *testing.T) {
	item := func(annotations string) *yaml.RNode {
		return yaml.MustParse("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  annotations:\n" + annotations)
	}
	cases := []struct {
		name  string
		items []*yaml.RNode
		fc    *yaml.RNode
		want  Invoker
	}{
		{"kpt fn render", []*yaml.RNode{item("    internal.config.kubernetes.io/path: 'a.yaml'\n    internal.config.kubernetes.io/seqindent: 'compact'\n")}, nil, Kpt},
		{"kpt fn eval --fn-config on an empty package", nil, item("    internal.config.kubernetes.io/seqindent: 'compact'\n"), Kpt},
		{"kustomize transformer", []*yaml.RNode{item("    kustomize.config.k8s.io/id: x\n")}, nil, Kustomize},
		{"kustomize over files kpt once rendered", []*yaml.RNode{item("    internal.config.kubernetes.io/seqindent: 'compact'\n"), item("    kustomize.config.k8s.io/id: x\n")}, nil, Kustomize},
		{"the function's own output, paths and all", []*yaml.RNode{item("    internal.config.kubernetes.io/path: 'a.yaml'\n")}, nil, Kustomize},
		{"a ResourceList by hand", []*yaml.RNode{item("    a: b\n")}, nil, Kustomize},
	}
	for _, tc := range cases {
		if got := InvokedBy(tc.items, tc.fc); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
