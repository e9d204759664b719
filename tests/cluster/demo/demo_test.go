package demo

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The demo reads the instance, namespace and image list from the rendered
// quickstart; expected.yaml is that rendering, kept current by the example
// tests, so a change to the example that the demo cannot follow fails here.
func TestDescribe(t *testing.T) {
	quickstart, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "quickstart", "expected.yaml"))
	if err != nil {
		t.Fatalf("read the quickstart's rendering: %v", err)
	}
	noDaemonSet := `apiVersion: v1
kind: ConfigMap
metadata: {name: l, namespace: ns}
data: {images.txt: "docker.io/library/busybox:1.37\n"}
`
	noList := `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: d, namespace: ns}
spec:
  template:
    spec:
      containers:
      - name: watch
        env: [{name: INSTANCE_NAME, value: x}]
`
	tests := []struct {
		name          string
		manifests     string
		wantInstance  string
		wantNamespace string
		wantImages    []string
		wantSelector  string
		wantErr       string
	}{
		{
			name:          "quickstart",
			manifests:     string(quickstart),
			wantInstance:  "quickstart",
			wantNamespace: "image-prefetcher",
			wantImages:    []string{"registry.k8s.io/pause:3.10", "docker.io/library/busybox:1.37", "docker.io/library/nginx:1.27"},
			wantSelector:  "kubernetes.io/os=linux",
		},
		{name: "no DaemonSet", manifests: noDaemonSet, wantErr: "no DaemonSet with an INSTANCE_NAME"},
		{name: "no image list", manifests: noList, wantErr: "no image-list ConfigMap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Decode([]byte(tc.manifests))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			instance, namespace, images, err := Describe(objs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Describe: error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Describe: %v", err)
			}
			if instance != tc.wantInstance || namespace != tc.wantNamespace {
				t.Errorf("instance, namespace = %q, %q, want %q, %q", instance, namespace, tc.wantInstance, tc.wantNamespace)
			}
			slices.Sort(images)
			want := slices.Sorted(slices.Values(tc.wantImages))
			if !slices.Equal(images, want) {
				t.Errorf("images = %v, want %v", images, want)
			}
			if sel := NodeSelector(objs); sel != tc.wantSelector {
				t.Errorf("NodeSelector = %q, want %q", sel, tc.wantSelector)
			}
		})
	}
}
