package krm

import (
	"slices"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"

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
			warned = warned || r.Severity == framework.Warning && strings.Contains(r.Message, "a nameSuffix added after the function would be cut")
		}
		ds := "image-prefetcher-" + name
		shared := v1alpha1.DaemonSetOfPod(podOf(ds+"-east")) == v1alpha1.DaemonSetOfPod(podOf(ds+"-west"))
		if warned != shared || warned != (n == 40) {
			t.Errorf("instance name of %d characters: warned %t, copies share one identity %t", n, warned, shared)
		}
	}
}

// withTaint gives an ImagePrefetcher item a startup taint and narrowed
// tolerations.
func withTaint(item, key string) string {
	return strings.Replace(item, "    images: [debian:bookworm]\n",
		"    images: [debian:bookworm]\n    startupTaint: {key: "+key+"}\n    tolerations: [{key: dedicated, operator: Exists}]\n", 1)
}

// tolerated is the set of keys the DaemonSet of instance name tolerates.
func tolerated(t *testing.T, out string, name string) []string {
	t.Helper()
	rl, err := fn.ParseResourceList(resourceList(out, ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range rl.Items {
		if it.GetKind() != "DaemonSet" || it.GetName() != "image-prefetcher-"+name {
			continue
		}
		tols, _, _ := it.NestedSlice("spec", "template", "spec", "tolerations")
		var keys []string
		for _, tol := range tols {
			k, _, _ := tol.NestedString("key")
			keys = append(keys, k)
		}
		return keys
	}
	t.Fatalf("no DaemonSet for %s in\n%s", name, out)
	return nil
}

// TestComposition: sibling lower layers whose startup taints would
// deadlock a node are refused naming both; kpt re-renders take the
// startup taints to tolerate from the intents only, never from a
// DaemonSet the run replaces (an old key) or removes (a removed
// instance's).
func TestComposition(t *testing.T) {
	lowerA := rendered(t, resourceList(withTaint(kustomizeIP("prefetch", "a"), "example.com/a"), ""))
	lowerB := rendered(t, resourceList(withTaint(kustomizeIP("prefetch", "b"), "example.com/b"), ""))
	_, results, err := Run(resourceList(lowerA+lowerB, ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"rendered by a lower layer for ImagePrefetcher prefetch/a, which has a startup taint, does not tolerate example.com/b, the startup taint of ImagePrefetcher prefetch/b",
		"rendered by a lower layer for ImagePrefetcher prefetch/b, which has a startup taint, does not tolerate example.com/a, the startup taint of ImagePrefetcher prefetch/a",
	} {
		if results.ExitCode() == 0 || !strings.Contains(results.Error(), want) {
			t.Errorf("siblings: results %v, want an error with %q", results, want)
		}
	}

	web := withTaint(kptIP("prefetch", "web", "web.yaml"), "example.com/old")
	db := withTaint(kptIP("prefetch", "db", "db.yaml"), "example.com/db")
	first := rendered(t, resourceList(web+db, ""))
	if got := tolerated(t, first, "web"); !slices.Equal(got, []string{"dedicated", "example.com/db", "example.com/old"}) {
		t.Fatalf("first render: web tolerates %v", got)
	}
	for name, edit := range map[string]func(string) string{
		"key changed":      func(s string) string { return strings.Replace(s, "key: example.com/old}", "key: example.com/new}", 1) },
		"instance removed": func(s string) string { return strings.Replace(s, db, "", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			// The edited intents, and what the first render wrote.
			in := edit(web + db)
			for _, item := range strings.SplitAfter(first, "\n- ")[1:] {
				if !strings.Contains(item, "kind: ImagePrefetcher\n") {
					in += "- " + strings.TrimSuffix(item, "- ")
				}
			}
			once := rendered(t, resourceList(in, ""))
			twice := rendered(t, resourceList(once, ""))
			if once != twice {
				t.Errorf("a second render changed the output")
			}
			for _, key := range tolerated(t, once, "web") {
				if name == "key changed" && key == "example.com/old" || name == "instance removed" && key == "example.com/db" {
					t.Errorf("web tolerates %s, the startup taint of an earlier render", key)
				}
			}
		})
	}
}
