package render

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// TestListSize: the rendered list is an error above the apiserver's 1 MiB
// ConfigMap limit and a warning where client-side apply's 256 KiB
// annotation limit would fail, each with the byte count.
func TestListSize(t *testing.T) {
	// Each reference renders to 100 bytes with its newline.
	images := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("registry.example.com/platform/team-with-a-long-name/service-%05d:1.0.0-"+strings.Repeat("x", 27), i)
		}
		return out
	}
	for _, tc := range []struct {
		n        int
		severity framework.Severity // "" for no finding
	}{
		{n: 100},
		{n: 2500},                               // 250,000 bytes: the annotation copy still fits
		{n: 2600, severity: framework.Warning},  // 260,000 bytes, 262,600 with JSON's escaped newlines
		{n: 10485, severity: framework.Warning}, // 1,048,500 bytes: at most 1 MiB
		{n: 10486, severity: framework.Error},   // 1,048,600 bytes
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind, Spec: v1alpha1.Spec{Images: images(tc.n)}}
			ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
			c, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
			size := len(c.ImageListText())
			var got framework.Results
			for _, p := range probs {
				if p.Field.Path == "spec.images" {
					got = append(got, p)
				}
			}
			if tc.severity == "" {
				if len(got) > 0 {
					t.Fatalf("%d bytes: unexpected findings %+v", size, got)
				}
				return
			}
			if len(got) != 1 || got[0].Severity != tc.severity {
				t.Fatalf("%d bytes: findings %+v, want one %s", size, got, tc.severity)
			}
			if want := fmt.Sprintf("%d bytes (%d images)", size, tc.n); !strings.Contains(got[0].Message, want) {
				t.Errorf("message %q lacks %q", got[0].Message, want)
			}
			if tc.severity == framework.Warning && !strings.Contains(got[0].Message, "kubectl apply --server-side") {
				t.Errorf("warning does not recommend server-side apply: %q", got[0].Message)
			}
		})
	}
}
