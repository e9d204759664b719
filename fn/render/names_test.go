package render

import (
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// renderAll renders instance name in namespace ns with every option that
// adds objects or names: the OpenShift SCC and its Role, the Lease slots.
func renderAll(t *testing.T, ns, name string) []rendered {
	t.Helper()
	k := int32(3)
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind,
		Spec: v1alpha1.Spec{Images: []string{"debian:12"}, Flavor: v1alpha1.FlavorOCP, Pull: v1alpha1.Pull{MaxConcurrentNodes: &k}}}
	ip.Metadata.Name, ip.Metadata.Namespace = name, ns
	c, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		t.Fatalf("%s/%s: %+v", ns, name, probs)
	}
	objs, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	var out []rendered
	for _, o := range objs {
		out = append(out, rendered{kind: o.GetKind(), namespace: o.GetNamespace(), name: o.GetName()})
	}
	for i := range int(k) {
		out = append(out, rendered{kind: "Lease", namespace: ns, name: v1alpha1.LeaseName(name, i)})
	}
	return out
}

type rendered struct{ kind, namespace, name string }

// TestDerivedNamesFollowTheRule: every rendered name is
// image-prefetcher-<name>[.<suffix>] (namespaced) or
// image-prefetcher.<namespace>.<name>[.<suffix>] (cluster-scoped), the rule
// docs/api.md states. A new object with a '-' suffix fails here.
func TestDerivedNamesFollowTheRule(t *testing.T) {
	for _, o := range renderAll(t, "team-a", "web") {
		if o.kind == "Lease" {
			continue // named by the agent; see TestDerivedNamesNeverCollide
		}
		var base string
		if o.namespace == "" {
			base = AppName + ".team-a.web"
		} else {
			base = AppName + "-web"
		}
		if o.name != base && !strings.HasPrefix(o.name, base+".") {
			t.Errorf("%s %s: want %s or %s.<suffix>", o.kind, o.name, base, base)
		}
	}
}

// TestDerivedNamesNeverCollide renders instances whose names run into each
// other's suffixes (web and web-scc: web's SCC Role was once
// image-prefetcher-web-scc, the events Role of web-scc) and namespaces that
// do the same, and checks that no two instances share an object.
func TestDerivedNamesNeverCollide(t *testing.T) {
	owner := map[rendered]string{}
	for _, ns := range []string{"team", "team-a", "a"} {
		for _, name := range []string{"web", "web-scc", "scc", "web-slot-0", "a-web", "team-a-web", "web-0"} {
			for _, o := range renderAll(t, ns, name) {
				id := ns + "/" + name
				if prev, dup := owner[o]; dup && prev != id {
					t.Errorf("%s %s/%s is rendered by %s and by %s", o.kind, o.namespace, o.name, prev, id)
				}
				owner[o] = id
			}
		}
	}
}
