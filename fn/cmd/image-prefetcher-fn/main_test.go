package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files from the current output")

// golden compares got with the file, or rewrites the file under -update.
func golden(t *testing.T, file string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read golden file (run `go test ./fn/cmd/image-prefetcher-fn -update` to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -update if the change is intended):\n%s", file, diff(string(want), string(got)))
	}
}

// diff shows the first differing line with some context; enough to see
// what changed without a diff library.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  want: %q\n  got:  %q", i+1, wl, gl)
		}
	}
	return "(equal lines, different bytes)"
}

type outcome struct {
	stdout, stderr []byte
	code           int
}

func invoke(t *testing.T, in []byte) outcome {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(bytes.NewReader(in), &out, &errb, nil)
	return outcome{out.Bytes(), errb.Bytes(), code}
}

// TestRender runs every testdata/render/*.in.yaml ResourceList through the
// function and compares stdout, stderr and the exit code with the goldens.
// Each output must also be a fixed point: the function run on its own
// output changes nothing.
func TestRender(t *testing.T) {
	inputs, err := filepath.Glob("testdata/render/*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs in testdata/render: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		t.Run(name, func(t *testing.T) {
			input, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			o := invoke(t, input)
			if o.code != 0 {
				t.Fatalf("exit code %d, stderr:\n%s", o.code, o.stderr)
			}
			base := strings.TrimSuffix(in, ".in.yaml")
			golden(t, base+".out.yaml", o.stdout)
			golden(t, base+".stderr", o.stderr)

			again := invoke(t, input)
			if !bytes.Equal(again.stdout, o.stdout) {
				t.Errorf("two runs on the same input differ:\n%s", diff(string(o.stdout), string(again.stdout)))
			}
			// The whole output goes back in, results included, as a
			// pipeline that does not strip them would feed it. Results are
			// per run: while the ImagePrefetcher is still there (generator
			// config, kpt configPath) the run finds the same warnings once
			// more, and the output is the same bytes; once it has been
			// replaced by its expansion, nothing is left to warn about.
			rerun := invoke(t, o.stdout)
			if rerun.code != 0 {
				t.Fatalf("rerun on own output: exit code %d, stderr:\n%s", rerun.code, rerun.stderr)
			}
			want, wantStderr := o.stdout, o.stderr
			if !hasPrefetcher(t, o.stdout) {
				want, wantStderr = withoutResults(t, o.stdout), nil
			}
			if !bytes.Equal(rerun.stdout, want) {
				t.Errorf("not idempotent: running on its own output changed it:\n%s", diff(string(want), string(rerun.stdout)))
			}
			if !bytes.Equal(rerun.stderr, wantStderr) {
				t.Errorf("rerun on own output: stderr\n%s\nwant\n%s", rerun.stderr, wantStderr)
			}
		})
	}
}

// hasPrefetcher reports whether a ResourceList still holds an
// ImagePrefetcher, as an item or as the functionConfig.
func hasPrefetcher(t *testing.T, out []byte) bool {
	t.Helper()
	rl, err := fn.ParseResourceList(out)
	if err != nil {
		t.Fatal(err)
	}
	if rl.FunctionConfig.GetKind() == "ImagePrefetcher" {
		return true
	}
	for _, it := range rl.Items {
		if it.GetKind() == "ImagePrefetcher" {
			return true
		}
	}
	return false
}

// withoutResults drops the results section: what a run whose findings are
// gone leaves of an earlier output.
func withoutResults(t *testing.T, out []byte) []byte {
	t.Helper()
	if i := bytes.Index(out, []byte("\nresults:\n")); i >= 0 {
		return out[:i+1]
	}
	return out
}

const baseMeta = `apiVersion: image-prefetcher.stackrox.io/v1alpha1
kind: ImagePrefetcher
metadata:
  name: demo
  namespace: prefetch
`

// errorCases holds one case per validation rule. Each is an ImagePrefetcher
// (the functionConfig unless asItem) and optional other items.
var errorCases = []struct {
	name   string
	ip     string
	items  string
	asItem bool
}{
	{name: "unknown-field", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    paralelism: 2\n"},
	{name: "wrong-type", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    parallelism: four\n"},
	{name: "unsupported-api-version", ip: "apiVersion: image-prefetcher.stackrox.io/v9\nkind: ImagePrefetcher\nmetadata:\n  name: demo\n  namespace: prefetch\nspec:\n  images: [debian]\n", asItem: true},
	{name: "name-missing", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  namespace: prefetch\nspec:\n  images: [debian]\n"},
	// No metadata. A functionConfig gets one error at metadata, not two
	// about an unnamed object; an item has metadata by the time the
	// function sees it (framework.Execute marks every item to match its
	// output up), so its findings are the name and the namespace.
	{name: "metadata-null", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata: null\nspec:\n  images: [debian]\n", asItem: true},
	{name: "metadata-missing", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nspec:\n  images: [debian]\n"},
	{name: "name-invalid", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: My_Prefetcher\n  namespace: prefetch\nspec:\n  images: [debian]\n"},
	{name: "name-too-long", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: " + strings.Repeat("a", 64) + "\n  namespace: prefetch\nspec:\n  images: [debian]\n"},
	{name: "namespace-missing", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: demo\nspec:\n  images: [debian]\n"},
	{name: "namespace-invalid", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: demo\n  namespace: Pre.Fetch\nspec:\n  images: [debian]\n"},
	{name: "image-invalid", ip: baseMeta + "spec:\n  images:\n  - debian\n  - Debian:12\n"},
	// Objects that look like ImagePrefetchers but are not: a kind of the
	// API group the function does not know, and the kind under a
	// misspelled group. Each is refused at the field to change.
	{name: "typo-kind", ip: baseMeta + "spec:\n  images: [debian]\n",
		items: "- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: Imageprefetcher\n  metadata:\n    name: typo-kind\n    namespace: prefetch\n  spec:\n    images: [debian]\n"},
	{name: "typo-group", ip: baseMeta + "spec:\n  images: [debian]\n",
		items: "- apiVersion: image-prefetcher.stackrox.com/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: typo-group\n    namespace: prefetch\n  spec:\n    images: [debian]\n"},
	{name: "image-substitution-variable", ip: baseMeta + "spec:\n  images:\n  - ${REGISTRY}/app:1\n"},
	{name: "image-empty-entry", ip: baseMeta + "spec:\n  images:\n  - debian\n  - \"  \"\n"},
	{name: "list-empty", ip: baseMeta + "spec:\n  images: []\n"},
	{name: "image-list-from-without-ref", ip: baseMeta + "spec:\n  imageListFrom: {}\n"},
	{name: "configmap-ref-name-missing", ip: baseMeta + "spec:\n  imageListFrom:\n    configMapRef: {key: images.txt}\n"},
	{name: "configmap-ref-key-missing", ip: baseMeta + "spec:\n  imageListFrom:\n    configMapRef: {name: images}\n"},
	{name: "configmap-not-found", ip: baseMeta + "spec:\n  imageListFrom:\n    configMapRef: {name: images, key: images.txt}\n", asItem: true},
	{name: "configmap-key-not-found", ip: baseMeta + "spec:\n  imageListFrom:\n    configMapRef: {name: images, key: list}\n", asItem: true,
		items: "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: images\n    namespace: prefetch\n  data:\n    images.txt: debian\n"},
	{name: "configmap-invalid-line", ip: baseMeta + "spec:\n  imageListFrom:\n    configMapRef: {name: images, key: images.txt}\n", asItem: true,
		items: "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: images\n    namespace: prefetch\n  data:\n    images.txt: |\n      debian\n      # ok\n      Debian:12\n"},
	{name: "flavor-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  flavor: gke\n"},
	{name: "runtime-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  runtime: docker\n"},
	{name: "cri-socket-relative", ip: baseMeta + "spec:\n  images: [debian]\n  criSocket: run/containerd/containerd.sock\n"},
	{name: "cri-socket-unclean", ip: baseMeta + "spec:\n  images: [debian]\n  criSocket: /run/../etc/containerd.sock\n"},
	{name: "cri-socket-under-root", ip: baseMeta + "spec:\n  images: [debian]\n  criSocket: /containerd.sock\n"},
	{name: "agent-image-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    image: \"ghcr.io/x/y:bad tag\"\n"},
	{name: "agent-resources-request-above-limit", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    resources:\n      requests: {memory: 1Gi}\n      limits: {memory: 128Mi}\n"},
	{name: "pull-secret-invalid-name", ip: baseMeta + "spec:\n  images: [debian]\n  imagePullSecrets: [Bad_Name]\n"},
	{name: "pull-secret-duplicate", ip: baseMeta + "spec:\n  images: [debian]\n  imagePullSecrets: [creds, creds]\n"},
	{name: "agent-pull-secret-invalid-name", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    imagePullSecrets: [Mirror_Pull]\n"},
	{name: "agent-pull-secret-duplicate", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    imagePullSecrets: [mirror, mirror]\n"},
	{name: "metrics-port-out-of-range", ip: baseMeta + "spec:\n  images: [debian]\n  metrics:\n    enabled: true\n    port: 70000\n"},
	{name: "metrics-pod-monitor-without-enabled", ip: baseMeta + "spec:\n  images: [debian]\n  metrics:\n    podMonitor: true\n"},
	{name: "metrics-rules-without-enabled", ip: baseMeta + "spec:\n  images: [debian]\n  metrics:\n    enabled: false\n    rules: true\n"},
	{name: "credential-provider-missing-field", ip: baseMeta + "spec:\n  images: [debian]\n  credentialProvider:\n    configPath: /etc/kubernetes/cp.yaml\n"},
	{name: "credential-provider-relative-path", ip: baseMeta + "spec:\n  images: [debian]\n  credentialProvider:\n    configPath: cp.yaml\n    binDir: /usr/libexec/cp\n"},
	{name: "node-selector-invalid-key", ip: baseMeta + "spec:\n  images: [debian]\n  nodeSelector:\n    \"bad key\": x\n"},
	{name: "node-selector-invalid-value", ip: baseMeta + "spec:\n  images: [debian]\n  nodeSelector:\n    disk: \"not valid!\"\n"},
	{name: "toleration-operator-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  tolerations:\n  - key: a\n    operator: In\n"},
	{name: "toleration-exists-with-value", ip: baseMeta + "spec:\n  images: [debian]\n  tolerations:\n  - key: a\n    operator: Exists\n    value: b\n"},
	{name: "toleration-effect-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  tolerations:\n  - operator: Exists\n    effect: NoRun\n"},
	{name: "priority-class-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  priorityClassName: Critical!\n"},
	{name: "parallelism-out-of-range", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    parallelism: 0\n"},
	{name: "duration-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    overallTimeout: 20 minutes\n"},
	{name: "duration-not-positive", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    maxRetryDelay: 0s\n"},
	{name: "refresh-interval-negative", ip: baseMeta + "spec:\n  images: [debian]\n  refreshInterval: -1m\n"},
	{name: "initial-attempt-above-max", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    initialAttemptTimeout: 10m\n    maxAttemptTimeout: 5m\n"},
	{name: "initial-retry-above-max", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    initialRetryDelay: 15m\n"},
	{name: "pull-policy-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    policy: Never\n"},
	{name: "max-concurrent-nodes-out-of-range", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    maxConcurrentNodes: -1\n"},
	{name: "seed-nodes-negative", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    maxConcurrentNodes: 3\n    seedNodes: -1\n"},
	{name: "pin-budget-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  pin:\n    budget: lots\n"},
	{name: "pin-budget-share-above-100", ip: baseMeta + "spec:\n  images: [debian]\n  pin:\n    budget: 120%\n"},
	{name: "pin-budget-negative", ip: baseMeta + "spec:\n  images: [debian]\n  pin:\n    budget: -5Gi\n"},
	{name: "seed-nodes-without-cap", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    seedNodes: 1\n"},
	{name: "max-unavailable-below-one", ip: baseMeta + "spec:\n  images: [debian]\n  rollout:\n    maxUnavailable: 0\n"},
	{name: "max-unavailable-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  rollout:\n    maxUnavailable: 0%\n"},
	{name: "agent-resources-bad-quantity", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    resources:\n      limits: {cpu: lots}\n"},
	{name: "duplicate-key", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    parallelism: 2\n    parallelism: 3\n"},
	{name: "non-string-key", ip: baseMeta + "spec:\n  images: [debian]\n  nodeSelector:\n    1: a\n"},
	{name: "undecodable-value", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    parallelism: !!int four\n"},
	{name: "duration-bare-number", ip: baseMeta + "spec:\n  images: [debian]\n  refreshInterval: 30\n"},
	{name: "duration-bare-zero-not-allowed", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    overallTimeout: 0\n"},
	{name: "max-unavailable-wrong-type", ip: baseMeta + "spec:\n  images: [debian]\n  rollout:\n    maxUnavailable: true\n"},
	// Rules the kube-apiserver applies to what the values render into.
	{name: "toleration-empty-key-equal", ip: baseMeta + "spec:\n  images: [debian]\n  tolerations:\n  - operator: Equal\n    value: x\n"},
	{name: "toleration-seconds-not-noexecute", ip: baseMeta + "spec:\n  images: [debian]\n  tolerations:\n  - key: k\n    operator: Exists\n    effect: NoSchedule\n    tolerationSeconds: 30\n"},
	{name: "toleration-invalid-key", ip: baseMeta + "spec:\n  images: [debian]\n  tolerations:\n  - key: 'bad key!'\n    operator: Exists\n"},
	{name: "affinity-no-terms", ip: baseMeta + "spec:\n  images: [debian]\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms: []\n"},
	{name: "affinity-pod-term-without-topology-key", ip: baseMeta + "spec:\n  images: [debian]\n  affinity:\n    podAntiAffinity:\n      preferredDuringSchedulingIgnoredDuringExecution:\n      - weight: 101\n        podAffinityTerm:\n          labelSelector: {matchLabels: {app: x}}\n"},
	{name: "resources-not-a-resource", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    resources:\n      requests: {gpu: 1}\n"},
	{name: "resources-negative", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    resources:\n      requests: {memory: -1Mi}\n"},
	{name: "resources-extended-without-limit", ip: baseMeta + "spec:\n  images: [debian]\n  agent:\n    resources:\n      requests: {nvidia.com/gpu: 1}\n"},
	{name: "disk-ceiling-out-of-range", ip: baseMeta + "spec:\n  images: [debian]\n  disk:\n    ceilingPercent: 0\n"},
	{name: "disk-image-filesystem-relative", ip: baseMeta + "spec:\n  images: [debian]\n  disk:\n    imageFilesystem: var/lib/containerd\n"},
	{name: "disk-image-filesystem-unclean", ip: baseMeta + "spec:\n  images: [debian]\n  disk:\n    imageFilesystem: /var/lib/containerd/\n"},
	{name: "disk-image-filesystem-root", ip: baseMeta + "spec:\n  images: [debian]\n  disk:\n    imageFilesystem: /\n"},
	{name: "disk-image-filesystem-mount-clash", ip: baseMeta + "spec:\n  images: [debian]\n  disk:\n    imageFilesystem: /run/containerd\n"},
	{name: "cri-socket-mount-clash", ip: baseMeta + "spec:\n  images: [debian]\n  criSocket: /tmp/containerd.sock\n"},
	{name: "credential-provider-mount-clash", ip: baseMeta + "spec:\n  images: [debian]\n  credentialProvider:\n    configPath: /run/containerd/cp.yaml\n    binDir: /run/containerd\n"},
	{name: "labels-invalid", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: demo\n  namespace: prefetch\n  labels:\n    'bad key!': x\n    team: 'not valid!'\nspec:\n  images: [debian]\n"},
	{name: "list-too-large", ip: baseMeta + "spec:\n  images:\n" + manyImages(12000)},
	// Bounds and the fields that bound one another.
	{name: "refresh-interval-below-minimum", ip: baseMeta + "spec:\n  images: [debian]\n  refreshInterval: 10ms\n"},
	{name: "overall-timeout-below-minimum", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    overallTimeout: 1ns\n"},
	{name: "attempt-timeout-below-minimum", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    initialAttemptTimeout: 500ms\n"},
	{name: "overall-timeout-below-initial-attempt", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    initialAttemptTimeout: 10m\n    maxAttemptTimeout: 10m\n    overallTimeout: 5m\n"},
	{name: "seed-nodes-above-cap", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    maxConcurrentNodes: 2\n    seedNodes: 3\n"},
	// Messages that name the value and the fix.
	{name: "node-selector-bool-value", ip: baseMeta + "spec:\n  images: [debian]\n  nodeSelector:\n    gpu: true\n"},
	{name: "parallelism-int32-overflow", ip: baseMeta + "spec:\n  images: [debian]\n  pull:\n    maxConcurrentNodes: 2147483648\n"},
	{name: "name-too-long-after-name-prefix", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: production-eu-west-1-" + strings.Repeat("x", 50) + "\n  namespace: prefetch\n  annotations:\n    internal.config.kubernetes.io/previousNames: " + strings.Repeat("x", 50) +
		"\n    internal.config.kubernetes.io/previousNamespaces: prefetch" +
		"\n    internal.config.kubernetes.io/previousKinds: ImagePrefetcher\nspec:\n  images: [debian]\n", asItem: true},
	{name: "generator-namespace-missing", ip: "apiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: demo\nspec:\n  images: [debian]\n",
		items: "- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: demo\n    annotations:\n      config.kubernetes.io/local-config: 'true'\n  spec:\n    images: [debian]\n"},
	{name: "configmap-other-namespace", ip: baseMeta + "spec:\n  imageListFrom:\n    configMapRef: {name: images, key: images.txt}\n", asItem: true,
		items: "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: images\n    namespace: platform\n  data:\n    images.txt: debian\n"},
	{name: "conflicting-object", ip: baseMeta + "spec:\n  images: [debian]\n", asItem: true,
		items: "- apiVersion: v1\n  kind: ServiceAccount\n  metadata:\n    name: image-prefetcher-demo\n    namespace: prefetch\n"},
	{name: "workloads-invalid-image", ip: baseMeta + "spec:\n  imageListFrom:\n    workloads: [{kind: Deployment}]\n", asItem: true,
		items: "- apiVersion: apps/v1\n  kind: Deployment\n  metadata:\n    name: web\n    namespace: shop\n  spec:\n    template:\n      spec:\n        containers:\n        - name: ok\n          image: nginx:1.27\n        - name: bad\n          image: Nginx:1.27\n        volumes:\n        - name: data\n          image: {reference: \"ghcr.io/x/data:v 1\"}\n"},
	{name: "workloads-invalid-image-kpt-file", ip: baseMeta + "spec:\n  imageListFrom:\n    workloads: [{}]\n", asItem: true,
		items: "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: debug\n    namespace: shop\n    annotations:\n      config.kubernetes.io/path: shop/debug.yaml\n      config.kubernetes.io/index: '2'\n  spec:\n    containers:\n    - name: shell\n      image: busybox:1.37\n    initContainers:\n    - name: wait\n      image: busybox::1\n"},
	{name: "workloads-image-not-string", ip: baseMeta + "spec:\n  imageListFrom:\n    workloads: [{}]\n", asItem: true,
		items: "- apiVersion: batch/v1\n  kind: CronJob\n  metadata:\n    name: report\n    namespace: shop\n  spec:\n    jobTemplate:\n      spec:\n        template:\n          spec:\n            containers:\n            - name: report\n              image: [nginx]\n"},
	{name: "workloads-selector-invalid", ip: baseMeta + "spec:\n  images: [debian]\n  imageListFrom:\n    workloads:\n    - name: \"web(\"\n      labelSelector: \"tier in (a\"\n    - {}\n", asItem: true},
	{name: "workloads-empty", ip: baseMeta + "spec:\n  images: [debian]\n  imageListFrom:\n    workloads: []\n", asItem: true},
	// What kustomize sends a generator: its config, echoed as the one
	// local-config item.
	{name: "workloads-in-generator", ip: baseMeta + "spec:\n  images: [debian]\n  imageListFrom:\n    workloads: [{}]\n",
		items: "- " + strings.ReplaceAll(strings.TrimSpace(baseMeta+"  annotations:\n    config.kubernetes.io/local-config: 'true'\nspec:\n  images: [debian]\n  imageListFrom:\n    workloads: [{}]"), "\n", "\n  ") + "\n"},
	{name: "workloads-select-nothing", ip: baseMeta + "spec:\n  imageListFrom:\n    workloads: [{namespace: missing}]\n", asItem: true},
	{name: "duplicate-instance", ip: baseMeta + "spec:\n  images: [debian]\n", asItem: true,
		items: "- " + strings.ReplaceAll(strings.TrimSpace(baseMeta+"spec:\n  images: [busybox]"), "\n", "\n  ") + "\n"},
	// One node key per name, whatever the namespace: both are named.
	{name: "same-name-two-namespaces", ip: baseMeta + "spec:\n  images: [debian]\n", asItem: true,
		items: "- apiVersion: image-prefetcher.stackrox.io/v1alpha1\n  kind: ImagePrefetcher\n  metadata:\n    name: demo\n    namespace: team-b\n  spec:\n    images: [busybox]\n"},
}

// manyImages is a YAML list of n distinct, long references.
func manyImages(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - registry.example.com/platform/team-with-a-long-name/service-with-a-long-name-%05d:1.0.0\n", i)
	}
	return b.String()
}

func indent(s, pad string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "")
}

// TestErrors checks each validation rule: exit code 1, one readable line
// per finding on stderr, results with severity, resourceRef and field
// path, and the items left as they were.
func TestErrors(t *testing.T) {
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			var in strings.Builder
			in.WriteString("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n")
			var items string
			if tc.asItem {
				items = "- " + strings.ReplaceAll(strings.TrimSuffix(tc.ip, "\n"), "\n", "\n  ") + "\n" + tc.items
			} else {
				items = tc.items
			}
			if items == "" {
				in.WriteString("- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: prefetch\n")
			} else {
				in.WriteString(items)
			}
			if !tc.asItem {
				in.WriteString("functionConfig:\n" + indent(tc.ip, "  "))
			}
			o := invoke(t, []byte(in.String()))
			if o.code != 1 {
				t.Errorf("exit code %d, want 1", o.code)
			}
			if len(o.stderr) == 0 {
				t.Error("nothing on stderr")
			}
			out := string(o.stdout)
			i := strings.Index(out, "\nresults:\n")
			if i < 0 {
				t.Fatalf("no results in output:\n%s", out)
			}
			if !strings.Contains(out, "  severity: error\n") {
				t.Errorf("no error result:\n%s", out[i:])
			}
			if strings.Contains(out, render0) {
				t.Errorf("objects were rendered despite the error:\n%s", out)
			}
			// Every error says which object and which field to fix.
			rl, err := fn.ParseResourceList(o.stdout)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rl.Results {
				if r.Severity == fn.Error && (r.ResourceRef == nil || r.Field == nil || r.Field.Path == "") {
					t.Errorf("error result without resourceRef or field path: %+v", r)
				}
			}
			golden(t, filepath.Join("testdata", "errors", tc.name+".golden"),
				[]byte(fmt.Sprintf("# exit code: %d\n# stderr:\n%s# results:\n%s", o.code, indent(string(o.stderr), "#   "), out[i+len("\nresults:\n"):])))
		})
	}
}

// render0 is a line only rendered output contains.
const render0 = "kind: DaemonSet"

// TestRenderedInvariants checks properties every rendered output must have,
// over all render goldens, so that a new case cannot quietly break them.
func TestRenderedInvariants(t *testing.T) {
	outputs, err := filepath.Glob("testdata/render/*.out.yaml")
	if err != nil || len(outputs) == 0 {
		t.Fatalf("no goldens in testdata/render: %v", err)
	}
	for _, file := range outputs {
		t.Run(filepath.Base(file), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			rl, err := fn.ParseResourceList(b)
			if err != nil {
				t.Fatal(err)
			}
			fc := rl.FunctionConfig
			kpt := false
			for _, it := range rl.Items {
				if it.PathAnnotation() != "" && it.GetLabel("app.kubernetes.io/managed-by") == "" {
					kpt = true
				}
			}
			// kustomize calls a generator with nothing but the echo of its
			// config, which the function drops: a generator's output holds
			// only rendered objects.
			generator := fc.GetKind() == "ImagePrefetcher" && !kpt
			for _, it := range rl.Items {
				if it.GetLabel("app.kubernetes.io/managed-by") != "image-prefetcher-fn" {
					generator = false
				}
			}
			// kpt refuses a ResourceList in which two objects claim the
			// same place in the same file.
			at := map[string]string{}
			for _, it := range rl.Items {
				p := it.PathAnnotation()
				if p == "" {
					continue
				}
				key := fmt.Sprintf("%s#%d", p, it.IndexAnnotation())
				where := it.GetKind() + " " + strings.TrimPrefix(it.GetNamespace()+"/"+it.GetName(), "/")
				if prev, dup := at[key]; dup {
					t.Errorf("%s and %s share path and index %s", prev, where, key)
				}
				at[key] = where
			}
			sawDaemonSet := false
			for _, it := range rl.Items {
				if it.GetLabel("app.kubernetes.io/managed-by") != "image-prefetcher-fn" {
					continue
				}
				where := it.GetKind() + " " + it.GetName()
				for k := range it.GetAnnotations() {
					switch {
					// kpt's file annotations, in the form(s) the input uses
					// (framework.Execute keeps them in step).
					case k == "internal.config.kubernetes.io/path" || k == "internal.config.kubernetes.io/index",
						k == "config.kubernetes.io/path" || k == "config.kubernetes.io/index":
						if generator {
							t.Errorf("%s: %s in generator mode", where, k)
						}
					case strings.HasPrefix(k, "config.kubernetes.io/"), strings.HasPrefix(k, "internal.config.kubernetes.io/"), strings.HasPrefix(k, "config.k8s.io/"):
						t.Errorf("%s: config annotation %s copied onto the output", where, k)
					case k == "kustomize.config.k8s.io/needs-hash":
						if !generator || it.GetKind() != "ConfigMap" {
							t.Errorf("%s: needs-hash outside a generator-mode ConfigMap", where)
						}
					}
				}
				if it.GetKind() == "ConfigMap" && generator && it.GetAnnotation("kustomize.config.k8s.io/needs-hash") != "true" {
					t.Errorf("%s: generator-mode ConfigMap lacks needs-hash", where)
				}
				text := it.String()
				for _, bad := range []string{"status:", ": null", "privileged: true", "allowPrivilegeEscalation: true", "add:"} {
					if strings.Contains(text, bad) {
						t.Errorf("%s contains %q", where, bad)
					}
				}
				// No empty map or list of the function's own making. The
				// fields copied from the user stay as written: an empty
				// map there can mean something ("labelSelector: {}"
				// selects every pod), so they are left out of this check.
				own := strings.ReplaceAll(withoutUserFields(t, it).MustString(), "emptyDir: {}\n", "")
				for _, bad := range []string{": {}\n", ": []\n"} {
					if strings.Contains(own, bad) {
						t.Errorf("%s contains %q outside the user's fields", where, bad)
					}
				}
				if it.GetKind() != "DaemonSet" {
					continue
				}
				sawDaemonSet = true
				var ds appsv1.DaemonSet
				if err := it.As(&ds); err != nil {
					t.Fatal(err)
				}
				pod := ds.Spec.Template.Spec
				if pod.HostNetwork || pod.HostPID || pod.HostIPC {
					t.Errorf("%s shares a host namespace", where)
				}
				for _, c := range append(pod.InitContainers, pod.Containers...) {
					sc := c.SecurityContext
					switch {
					case sc == nil:
						t.Errorf("%s/%s: no securityContext", where, c.Name)
					case sc.Privileged == nil || *sc.Privileged,
						sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation,
						sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem,
						sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0,
						sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault":
						t.Errorf("%s/%s: securityContext is not least-privilege: %+v", where, c.Name, sc)
					}
					for _, m := range c.VolumeMounts {
						if m.MountPath != "/tmp" && !m.ReadOnly {
							t.Errorf("%s/%s: mount %s is writable", where, c.Name, m.MountPath)
						}
					}
				}
				if ds.Spec.Template.Annotations["image-prefetcher.stackrox.io/config-hash"] == "" {
					t.Errorf("%s: no config-hash annotation on the pod template", where)
				}
			}
			if !sawDaemonSet {
				t.Error("no DaemonSet rendered")
			}
		})
	}
}

// withoutUserFields is a copy of a rendered object without the pod fields
// the function copies from the ImagePrefetcher as the user wrote them.
func withoutUserFields(t *testing.T, o *fn.KubeObject) *yaml.RNode {
	t.Helper()
	n := o.CopyToResourceNode()
	if o.GetKind() != "DaemonSet" {
		return n
	}
	pod, err := n.Pipe(yaml.Lookup("spec", "template", "spec"))
	if err != nil || pod == nil {
		t.Fatalf("DaemonSet without a pod spec: %v", err)
	}
	for _, f := range []string{"affinity", "tolerations", "nodeSelector"} {
		if err := pod.PipeE(yaml.Clear(f)); err != nil {
			t.Fatal(err)
		}
	}
	for _, list := range []string{"initContainers", "containers"} {
		cs, err := pod.Pipe(yaml.Lookup(list))
		if err != nil || cs == nil {
			continue
		}
		for _, c := range cs.Content() {
			if err := yaml.NewRNode(c).PipeE(yaml.Clear("resources")); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n
}

// TestIncomingResultsAreDropped: results in the input were reported by an
// earlier run or another function. They are neither repeated nor allowed to
// fail this run.
func TestIncomingResultsAreDropped(t *testing.T) {
	const old = "results:\n- message: found by an earlier run\n  severity: error\n- message: an old warning\n  severity: warning\n"
	cases := []struct {
		name, in string
		// stderr is what this run itself reports.
		stderr string
	}{
		{
			name:   "nothing to expand",
			in:     "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: prefetch\n" + old,
			stderr: "",
		},
		{
			name: "generator with a warning of its own",
			in: "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: prefetch\n" +
				"functionConfig:\n" + indent(baseMeta+"spec:\n  images: [debian, debian]\n", "  ") + old,
			stderr: "image-prefetcher-fn: warning: ImagePrefetcher prefetch/demo: spec.images[1]: \"debian\" duplicates \"debian\" of spec.images[0]; keeping the first\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := invoke(t, []byte(tc.in))
			if o.code != 0 {
				t.Errorf("exit code %d, want 0; stderr:\n%s", o.code, o.stderr)
			}
			if string(o.stderr) != tc.stderr {
				t.Errorf("stderr:\n%s\nwant\n%s", o.stderr, tc.stderr)
			}
			if strings.Contains(string(o.stdout), "earlier run") || strings.Contains(string(o.stdout), "old warning") {
				t.Errorf("incoming results kept in the output:\n%s", o.stdout)
			}
		})
	}
}

func TestArguments(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(strings.NewReader(""), &out, &errb, []string{"--version"}); code != 0 || strings.TrimSpace(out.String()) == "" {
		t.Errorf("--version: exit %d, output %q", code, out.String())
	}
	out.Reset()
	if code := run(strings.NewReader(""), &out, &errb, []string{"build"}); code != 2 || !strings.Contains(errb.String(), "reads a ResourceList on stdin") {
		t.Errorf("unexpected argument: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run(strings.NewReader("kind: NotAList\n"), &out, &errb, nil); code != 1 || !strings.Contains(errb.String(), "ResourceList") {
		t.Errorf("bad input: exit %d, stderr %q", code, errb.String())
	}
}

// TestUnreadableInput: input that is no ResourceList the function can
// read exits 1 with one line on stderr that says what is wrong, and
// writes nothing on stdout.
func TestUnreadableInput(t *testing.T) {
	const rl = "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\n"
	cases := []struct{ name, in, want string }{
		{"not YAML", "items: [a\n", "failed to read ResourceList input: MalformedYAMLError"},
		{"a List", "apiVersion: v1\nkind: List\nitems: []\n", `got kind "List", want ResourceList`},
		{"an item that is not an object", rl + "items:\n- 5\n", "expected MappingNode but got ScalarNode"},
		{"metadata that is not an object", rl + "items:\n- kind: A\n  metadata: 5\n",
			"expected MappingNode but got ScalarNode"},
		{"an item in two files", rl + "items:\n- kind: A\n  metadata:\n    name: a\n    annotations:\n" +
			"      config.kubernetes.io/path: a.yaml\n      internal.config.kubernetes.io/path: b.yaml\n",
			"mismatched legacy and internal path annotations"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := invoke(t, []byte(tc.in))
			if o.code != 1 {
				t.Errorf("exit code %d, want 1", o.code)
			}
			if len(o.stdout) > 0 {
				t.Errorf("stdout:\n%s\nwant nothing", o.stdout)
			}
			line := string(o.stderr)
			if !strings.HasPrefix(line, "image-prefetcher-fn: ResourceList on stdin: ") || !strings.Contains(line, tc.want) {
				t.Errorf("stderr %q, want image-prefetcher-fn: ResourceList on stdin: ...%s...", line, tc.want)
			}
		})
	}
}
