package render

import (
	"slices"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/kio"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/fn/workloads"
)

// The rendered list names its sources in '#' lines. The agent parses the
// file with fn/imagelist: it must read exactly the list the hash covers,
// and the comments must not change the hash.
func TestSourceCommentsReachNoAgent(t *testing.T) {
	items, err := kio.FromBytes([]byte(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  template:
    spec:
      containers:
      - {name: web, image: "ghcr.io/example/web:2.0"}
      - {name: agent, image: "` + version.AgentImage() + `"}
      - {name: sidecar, image: "busybox:1.37"}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: report, namespace: shop}
spec:
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - {name: report, image: "ghcr.io/example/web:2.0"}
`))
	if err != nil {
		t.Fatal(err)
	}
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind}
	ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
	ip.Spec.Images = []string{"docker.io/library/busybox:1.37"}
	ip.Spec.ImageListFrom = &v1alpha1.ImageListSource{Workloads: []v1alpha1.WorkloadSelector{{}}}
	col := workloads.Collect(items, ip.Spec.ImageListFrom.Workloads)
	c, probs := ValidateSources(ip, Sources{Workloads: &col})
	if len(probs) > 0 {
		t.Fatalf("problems: %+v", probs)
	}
	want := []string{"docker.io/library/busybox:1.37", "ghcr.io/example/web:2.0"}
	if !slices.Equal(c.Images, want) {
		t.Errorf("images %q, want %q (the agent's own image left out)", c.Images, want)
	}
	text := c.ImageListText()
	if got := imagelist.Parse(text).Refs(); !slices.Equal(got, c.Images) {
		t.Errorf("the agent reads %q from\n%s\nwant %q", got, text, c.Images)
	}
	wantText := "# spec.images\ndocker.io/library/busybox:1.37\n# CronJob shop/report\nghcr.io/example/web:2.0\n" +
		"# Deployment shop/web: nothing new: its images are listed above or are the agent's own, which is on the node already\n"
	if text != wantText {
		t.Errorf("list text\n%s\nwant\n%s", text, wantText)
	}
	plain := mustConfig(t, want, nil)
	if plain.Hash() != c.Hash() {
		t.Error("the source comments changed the pod-template hash")
	}
}
