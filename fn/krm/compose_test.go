package krm

import (
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// TestSuffixWarning: from an instance name of 40 characters, the DaemonSet
// name (57) leaves no room in the pod name for a nameSuffix added after the
// function, and copies under two suffixes would be one copy to the agent
// and the policy (v1alpha1.DaemonSetOfPod): a warning says so. At 39 the
// copies stay apart, and nothing is said.
func TestSuffixWarning(t *testing.T) {
	podOf := func(ds string) string { return (ds + "-")[:min(len(ds)+1, 58)] + "x7k2q" }
	for _, n := range []int{39, 40} {
		name := strings.Repeat("w", n)
		in := "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n" +
			"  kind: ImagePrefetcher\n  metadata: {name: " + name + ", namespace: prefetch}\n  spec: {images: [debian]}\n"
		_, results, err := Run([]byte(in))
		if err != nil || results.ExitCode() != 0 {
			t.Fatalf("%d characters: %v %v", n, err, results)
		}
		warned := false
		for _, r := range results {
			warned = warned || r.Severity == fn.Warning && strings.Contains(r.Message, "a nameSuffix added after the function would be cut")
		}
		ds := "image-prefetcher-" + name
		shared := v1alpha1.DaemonSetOfPod(podOf(ds+"-east")) == v1alpha1.DaemonSetOfPod(podOf(ds+"-west"))
		if warned != shared || warned != (n == 40) {
			t.Errorf("instance name of %d characters: warned %t, copies share one identity %t", n, warned, shared)
		}
	}
}
