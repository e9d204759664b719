package allowlist

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The examples' expected.yaml files are what the function renders
// (kept up to date by tests/examples).
func TestPublic(t *testing.T) {
	read := func(t *testing.T, path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	quickstart := read(t, "../../examples/quickstart/expected.yaml")
	private := read(t, "../../examples/private-registry/expected.yaml")
	tests := []struct {
		name, in string
		want     []string
		err      string
	}{
		{"no credentials: all public", quickstart, []string{"registry.k8s.io/pause:3.10", "docker.io/library/busybox:1.37", "docker.io/library/nginx:1.27"}, ""},
		{"pull secrets and credential plugins: none public", private, nil, ""},
		{"both", private + "\n---\n" + quickstart, []string{"registry.k8s.io/pause:3.10", "docker.io/library/busybox:1.37", "docker.io/library/nginx:1.27"}, ""},
		{"list not given", without(quickstart, "kind: ConfigMap"), nil, "is not in the manifests"},
		{"no agent", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n", nil, "no image-prefetcher DaemonSet"},
		{"not YAML", "kind: [", nil, "read manifests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Public(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// The kubelet (v1.36.3, pkg/kubelet/images/pullmanager) compares an
// allowlist entry with the pod's image as written, tag and digest cut
// off: every spelling a pod may use must be listed.
func TestEntries(t *testing.T) {
	got, err := Entries([]string{"docker.io/library/busybox:1.37", "nginx", "bitnami/redis:7", "ghcr.io/org/app@sha256:" + strings.Repeat("a", 64), "ghcr.io/org/app:v2", "localhost:5000/x:1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"bitnami/redis", "busybox",
		"docker.io/bitnami/redis", "docker.io/busybox", "docker.io/library/busybox", "docker.io/library/nginx", "docker.io/nginx",
		"ghcr.io/org/app", "library/busybox", "library/nginx", "localhost:5000/x", "nginx",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	if _, err := Entries([]string{"bad ref:1"}); err == nil {
		t.Error("an invalid reference was accepted")
	}
}

func TestSnippet(t *testing.T) {
	if got := Snippet([]string{"busybox", "ghcr.io/org/app"}); !strings.HasSuffix(got, "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist:\n- busybox\n- ghcr.io/org/app\n") {
		t.Errorf("got:\n%s", got)
	}
	// No public image: every image is verified, as under AlwaysVerify.
	if got := Snippet(nil); !strings.HasSuffix(got, "preloadedImagesVerificationAllowlist: []\n") {
		t.Errorf("got:\n%s", got)
	}
}

// without drops the documents of manifests that hold s.
func without(manifests, s string) string {
	var keep []string
	for _, d := range strings.Split(manifests, "\n---\n") {
		if !strings.Contains(d, s) {
			keep = append(keep, d)
		}
	}
	return strings.Join(keep, "\n---\n")
}
