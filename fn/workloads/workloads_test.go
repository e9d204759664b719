package workloads

import (
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/kio"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

const objects = `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: dev-web
  namespace: dev
  labels: {tier: frontend}
  annotations:
    internal.config.kubernetes.io/previousNames: "web,dev-web"
    internal.config.kubernetes.io/previousNamespaces: "default,dev"
    internal.config.kubernetes.io/previousKinds: "Deployment,Deployment"
spec:
  template:
    spec:
      containers:
      - {name: web, image: web:1}
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: report
spec:
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - {name: r, image: report:1}
---
apiVersion: v1
kind: Pod
metadata:
  name: local
  namespace: dev
  annotations:
    config.kubernetes.io/local-config: "true"
spec:
  containers:
  - {name: x, image: local:1}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: image-prefetcher-x
  namespace: dev
  labels: {app.kubernetes.io/managed-by: image-prefetcher-fn}
spec:
  template:
    spec:
      containers:
      - {name: watch, image: agent:1}
---
apiVersion: v1
kind: PodTemplate
metadata:
  name: template-at-top
  namespace: dev
template:
  spec:
    containers:
    - {name: t, image: top:1}
`

// TestCollectNamespaceOfAnObjectNeverRenamed: an object kustomize never
// renamed (kpt passes no previous names at all) is matched by its own
// namespace only. Its original namespace is its current one, not
// "default".
func TestCollectNamespaceOfAnObjectNeverRenamed(t *testing.T) {
	items, err := kio.FromBytes([]byte("apiVersion: apps/v1\nkind: Deployment\n" +
		"metadata:\n  name: web\n  namespace: shop\n" +
		"spec:\n  template:\n    spec:\n      containers:\n      - {name: web, image: web:1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]int{"default": 0, "shop": 1} {
		c := Collect(items, []v1alpha1.WorkloadSelector{{Namespace: ns}})
		if len(c.Workloads) != want {
			t.Errorf("namespace %s selected %v, want %d workloads", ns, c.Workloads, want)
		}
	}
}

func TestCollectSelects(t *testing.T) {
	items, err := kio.FromBytes([]byte(objects))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		selectors []v1alpha1.WorkloadSelector
		want      []string // workloads
		unmatched []int
	}{
		{name: "empty selector: every workload, not local-config or rendered ones", selectors: []v1alpha1.WorkloadSelector{{}}, want: []string{"CronJob report", "Deployment dev/dev-web"}},
		{name: "original name after namePrefix", selectors: []v1alpha1.WorkloadSelector{{Name: "web"}}, want: []string{"Deployment dev/dev-web"}},
		{name: "current name", selectors: []v1alpha1.WorkloadSelector{{Name: "dev-web"}}, want: []string{"Deployment dev/dev-web"}},
		{name: "name is anchored", selectors: []v1alpha1.WorkloadSelector{{Name: "we"}}, unmatched: []int{0}},
		{name: "no namespace is default", selectors: []v1alpha1.WorkloadSelector{{Namespace: "default"}}, want: []string{"CronJob report", "Deployment dev/dev-web"}},
		{name: "kind regex", selectors: []v1alpha1.WorkloadSelector{{Kind: "Cron.*|Pod"}}, want: []string{"CronJob report"}},
		{name: "group and version", selectors: []v1alpha1.WorkloadSelector{{Group: "apps", Version: "v1"}}, want: []string{"Deployment dev/dev-web"}},
		{name: "core group is empty", selectors: []v1alpha1.WorkloadSelector{{Group: "batch"}, {Kind: "Pod"}}, want: []string{"CronJob report"}, unmatched: []int{1}},
		{name: "label selector", selectors: []v1alpha1.WorkloadSelector{{LabelSelector: "tier in (frontend,backend)"}}, want: []string{"Deployment dev/dev-web"}},
		{name: "annotation selector", selectors: []v1alpha1.WorkloadSelector{{AnnotationSelector: "!internal.config.kubernetes.io/previousNames"}}, want: []string{"CronJob report"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Collect(items, tc.selectors)
			if len(c.Errors) > 0 {
				t.Fatalf("errors: %v", c.Errors)
			}
			var got []string
			for _, w := range c.Workloads {
				got = append(got, w.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("selected %q, want %q", got, tc.want)
			}
			if !slices.Equal(c.Unmatched, tc.unmatched) {
				t.Errorf("unmatched %v, want %v", c.Unmatched, tc.unmatched)
			}
			for _, w := range c.Workloads {
				if c.Node(w) == nil {
					t.Errorf("no node for %s", w)
				}
			}
		})
	}
}

func TestCollectImagesAndPaths(t *testing.T) {
	items, err := kio.FromBytes([]byte(`
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
spec:
  initContainers:
  - {name: i, image: " init:1 "}
  containers:
  - {name: c, image: main:1}
  - {name: nil, image: null}
  - {name: none}
  ephemeralContainers:
  - {name: e, image: debug:1}
  volumes:
  - name: v
    image: {reference: data:1}
  - name: cm
    configMap: {name: x}
  - name: noref
    image: {pullPolicy: Always}
`))
	if err != nil {
		t.Fatal(err)
	}
	c := Collect(items, []v1alpha1.WorkloadSelector{{}})
	var got []string
	for _, img := range c.Images {
		got = append(got, img.Path+"="+img.Ref)
	}
	want := []string{"spec.initContainers[0].image=init:1", "spec.containers[0].image=main:1", "spec.volumes[0].image.reference=data:1"}
	if !slices.Equal(got, want) {
		t.Errorf("images\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var skipped []string
	for _, s := range c.Skipped {
		skipped = append(skipped, s.Path)
	}
	if want := []string{"spec.containers[1].image", "spec.containers[2].image", "spec.volumes[2].image.reference"}; !slices.Equal(skipped, want) {
		t.Errorf("skipped %q, want %q", skipped, want)
	}
}

func TestCollectRejectsBadSelectors(t *testing.T) {
	c := Collect(nil, []v1alpha1.WorkloadSelector{{}, {Kind: "[", LabelSelector: "a in (", AnnotationSelector: "=x"}})
	var fields []string
	for _, e := range c.Errors {
		if e.Index != 1 {
			t.Errorf("error on selector %d, want 1: %v", e.Index, e.Err)
		}
		fields = append(fields, e.Field)
	}
	if want := []string{"labelSelector", "annotationSelector", "kind"}; !slices.Equal(fields, want) {
		t.Errorf("errors on %q, want %q", fields, want)
	}
}

// kpt orders a package's objects by file, kustomize by its resources list:
// the same workloads in another order give the same images.
func TestCollectOrderIsIndependentOfTheResourceList(t *testing.T) {
	items, err := kio.FromBytes([]byte(objects))
	if err != nil {
		t.Fatal(err)
	}
	reversed := slices.Clone(items)
	slices.Reverse(reversed)
	a := Collect(items, []v1alpha1.WorkloadSelector{{}})
	b := Collect(reversed, []v1alpha1.WorkloadSelector{{}})
	if !slices.Equal(a.Images, b.Images) || len(a.Images) != 2 {
		t.Errorf("images depend on the order of the items:\n%v\n%v", a.Images, b.Images)
	}
}
