package krm

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// TestStartupTaintsAcrossInstances: when tolerations are narrowed, every
// DaemonSet with a startup taint tolerates every startup-taint key in the
// ResourceList, from ImagePrefetchers and from DaemonSets a lower layer
// rendered, which must tolerate the new keys too: on a node that registers
// with both taints, both agents start.
func TestStartupTaintsAcrossInstances(t *testing.T) {
	ip := func(name, key string) string {
		return fmt.Sprintf("- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: %s\n    namespace: %s\n  spec:\n    images: [debian:bookworm]\n    tolerations: [{key: dedicated, operator: Exists}]\n    startupTaint: {key: %s}\n", name, name, key)
	}
	both := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + ip("a", "example.com/a") + ip("b", "example.com/b")
	lower := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n" + ip("a", "example.com/a")
	out, results, err := Run([]byte(lower))
	if err != nil || results.ExitCode() != 0 {
		t.Fatalf("lower layer: %v %v", err, results)
	}
	layered := strings.Replace(string(out), "items:\n", "items:\n"+ip("b", "example.com/b"), 1)
	layered = layered[:strings.Index(layered, "\nresults:\n")+1]
	_, results, err = Run([]byte(layered))
	if err != nil || results.ExitCode() == 0 || !strings.Contains(results.Error(), "rendered by a lower layer for ImagePrefetcher a/a, which has a startup taint, does not tolerate example.com/b, the startup taint of ImagePrefetcher b/b") {
		t.Errorf("a lower-layer DaemonSet without the new key: %v %v", err, results)
	}
	tolerant := strings.Replace(lower, "{key: dedicated, operator: Exists}", "{key: dedicated, operator: Exists}, {key: example.com/b, operator: Exists}", 1)
	if out, results, err = Run([]byte(tolerant)); err != nil || results.ExitCode() != 0 {
		t.Fatalf("lower layer: %v %v", err, results)
	}
	layered = strings.Replace(string(out), "items:\n", "items:\n"+ip("b", "example.com/b"), 1)
	layered = layered[:strings.Index(layered, "\nresults:\n")+1]
	for name, in := range map[string]string{"one run": both, "layers": layered} {
		t.Run(name, func(t *testing.T) {
			out, results, err := Run([]byte(in))
			if err != nil || results.ExitCode() != 0 {
				t.Fatalf("%v %v", err, results)
			}
			for _, ds := range parseItems(t, out) {
				if ds.GetKind() != "DaemonSet" {
					continue
				}
				tols, _ := ds.Pipe(yaml.Lookup("spec", "template", "spec", "tolerations"))
				var keys []string
				for _, tol := range tols.Content() {
					keys = append(keys, yaml.GetValue(yaml.NewRNode(tol).Field("key").Value))
				}
				if !slices.Contains(keys, "example.com/a") || !slices.Contains(keys, "example.com/b") || !slices.Contains(keys, "dedicated") {
					t.Errorf("DaemonSet %s/%s tolerates %v, want dedicated and both startup taints", ds.GetNamespace(), ds.GetName(), keys)
				}
			}
		})
	}
}
