package krm

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkRenderWorkloads is the whole function on a ResourceList of 500
// Deployments (3 containers each, 1,001 distinct images) and an
// ImagePrefetcher that selects them all with spec.imageListFrom.workloads;
// "inline" is the same ResourceList with those images in spec.images
// instead, so that the difference is the cost of reading the workloads.
// docs/api.md records its figure.
func BenchmarkRenderWorkloads(b *testing.B) {
	for _, mode := range []string{"workloads", "inline"} {
		b.Run(mode, func(b *testing.B) { benchmarkDeployments(b, mode == "workloads") })
	}
}

func benchmarkDeployments(b *testing.B, fromWorkloads bool) {
	var in strings.Builder
	in.WriteString("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n")
	in.WriteString("- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: big\n    namespace: prefetch\n  spec:\n")
	if fromWorkloads {
		in.WriteString("    imageListFrom:\n      workloads:\n      - kind: Deployment\n")
	} else {
		in.WriteString("    images:\n    - docker.io/envoyproxy/envoy:v1.32.3\n")
		for i := range 500 {
			fmt.Fprintf(&in, "    - registry.example.com/team-%[2]d/migrate-%[1]d:v1.%[3]d.0\n    - registry.example.com/team-%[2]d/app-%[1]d:v1.%[3]d.0\n", i, i%37, i%11)
		}
	}
	for i := range 500 {
		fmt.Fprintf(&in, `- apiVersion: apps/v1
  kind: Deployment
  metadata:
    name: app-%[1]d
    namespace: team-%[2]d
  spec:
    selector:
      matchLabels: {app: app-%[1]d}
    template:
      metadata:
        labels: {app: app-%[1]d}
      spec:
        initContainers:
        - name: migrate
          image: registry.example.com/team-%[2]d/migrate-%[1]d:v1.%[3]d.0
        containers:
        - name: app
          image: registry.example.com/team-%[2]d/app-%[1]d:v1.%[3]d.0
        - name: proxy
          image: docker.io/envoyproxy/envoy:v1.32.3
`, i, i%37, i%11)
	}
	input := []byte(in.String())
	for b.Loop() {
		out, results, err := Run(input)
		if err != nil || results.ExitCode() != 0 {
			b.Fatalf("err=%v results=%v", err, results)
		}
		if len(out) == 0 {
			b.Fatal("empty output")
		}
	}
}
