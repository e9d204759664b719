package conformance

import (
	"encoding/json"
	"fmt"
	"strings"
)

// handRows: the cases of issue #15 and the rules that tie fields together,
// which a walk over one field at a time cannot reach.
func handRows() []row {
	specRow := func(name, at string, spec map[string]any) row {
		return row{name: name, at: at}.with(func(d map[string]any) {
			s := d["spec"].(map[string]any)
			for k, v := range spec {
				s[k] = v
			}
		})
	}
	specJSON := func(name, at, js string) row {
		var spec map[string]any
		if err := json.Unmarshal([]byte(js), &spec); err != nil {
			panic(fmt.Sprintf("%s: %v", name, err))
		}
		return specRow(name, at, spec)
	}
	obj := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	list := func(v ...any) []any { return v }
	resources := func(requests, limits map[string]any) map[string]any {
		r := map[string]any{}
		if requests != nil {
			r["requests"] = requests
		}
		if limits != nil {
			r["limits"] = limits
		}
		return obj("resources", r)
	}
	pull := func(kv ...any) map[string]any { return obj("pull", obj(kv...)) }
	merge := func(ms ...map[string]any) map[string]any {
		out := map[string]any{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	images := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = fmt.Sprintf("registry.example.com/platform/team-with-a-long-name/service-with-a-long-name-%05d:1.0.0", i)
		}
		return out
	}

	rows := []row{
		// The table of the issue.
		specRow("toleration without key, Equal", "spec.tolerations", obj("tolerations", list(obj("operator", "Equal", "value", "x")))),
		specRow("tolerationSeconds with NoSchedule", "spec.tolerations", obj("tolerations", list(obj("key", "k", "operator", "Exists", "effect", "NoSchedule", "tolerationSeconds", 30)))),
		specRow("toleration key with a space", "spec.tolerations", obj("tolerations", list(obj("key", "bad key!", "operator", "Exists")))),
		specRow("no node selector terms", "spec.affinity", obj("affinity", obj("nodeAffinity", obj("requiredDuringSchedulingIgnoredDuringExecution", obj("nodeSelectorTerms", list()))))),
		specRow("request of gpu", "spec.agent", obj("agent", resources(obj("gpu", 1), nil))),
		specRow("negative memory", "spec.agent", obj("agent", resources(obj("memory", "-1Mi"), nil))),
		specRow("socket in /tmp", "spec.criSocket", obj("criSocket", "/tmp/containerd.sock")),
		specRow("socket in the list's directory", "spec.criSocket", obj("criSocket", "/etc/image-prefetcher/containerd.sock")),
		specRow("provider plugins in the socket's directory", "spec.credentialProvider", obj("credentialProvider", obj("configPath", "/run/containerd/cp.yaml", "binDir", "/run/containerd"))),
		specRow("12,000 images", "spec.images", obj("images", images(12000))),
		specRow("13,000 images, above 1 MiB", "spec.images", obj("images", images(13000))),

		// Sizes around the limits: client-side apply would fail (a warning),
		// server-side apply does not.
		specRow("3,000 images", "spec.images", obj("images", images(3000))),
		specRow("11,000 images", "spec.images", obj("images", images(11000))),

		// Mount paths meeting each other.
		specRow("provider config is the plugin directory", "spec.credentialProvider", obj("credentialProvider", obj("configPath", "/etc/cp", "binDir", "/etc/cp"))),
		specRow("provider config in the socket's place", "spec", merge(obj("criSocket", "/run/cp/containerd.sock"), obj("credentialProvider", obj("configPath", "/run/cp", "binDir", "/usr/libexec/cp")))),
		specRow("socket inside a pull secret's directory", "spec", merge(obj("imagePullSecrets", list("creds")), obj("criSocket", "/var/run/secrets/image-prefetcher/pull-secrets/creds/x.sock"))),
		specRow("socket below the list's directory", "spec.criSocket", obj("criSocket", "/etc/image-prefetcher/run/containerd.sock")),

		// Resources that depend on one another.
		specRow("cpu request above limit", "spec.agent", obj("agent", resources(obj("cpu", "200m"), obj("cpu", "100m")))),
		specRow("cpu request equal to limit", "spec.agent", obj("agent", resources(obj("cpu", "100m"), obj("cpu", "100m")))),
		specRow("extended resource, request below limit", "spec.agent", obj("agent", resources(obj("nvidia.com/gpu", 1), obj("nvidia.com/gpu", 2)))),
		specRow("extended resource, request equal to limit", "spec.agent", obj("agent", resources(obj("nvidia.com/gpu", 1), obj("nvidia.com/gpu", 1)))),
		specRow("extended resource, limit only", "spec.agent", obj("agent", resources(nil, obj("nvidia.com/gpu", 1)))),
		specRow("extended resource, half a unit", "spec.agent", obj("agent", resources(obj("nvidia.com/gpu", "500m"), obj("nvidia.com/gpu", "500m")))),
		specRow("hugepages alone", "spec.agent", obj("agent", resources(obj("hugepages-2Mi", "2Mi"), obj("hugepages-2Mi", "2Mi")))),
		specRow("hugepages with memory", "spec.agent", obj("agent", resources(obj("hugepages-2Mi", "2Mi", "memory", "64Mi"), obj("hugepages-2Mi", "2Mi", "memory", "64Mi")))),
		specRow("hugepages not a multiple of the page", "spec.agent", obj("agent", resources(obj("hugepages-2Mi", "3Mi", "memory", "64Mi"), obj("hugepages-2Mi", "3Mi", "memory", "64Mi")))),
		specRow("hugepages request without limit", "spec.agent", obj("agent", resources(obj("hugepages-2Mi", "2Mi", "memory", "64Mi"), nil))),
		specRow("resource claim", "spec.agent", obj("agent", obj("resources", obj("claims", list(obj("name", "gpu")))))),
		specRow("empty resources", "spec.agent", obj("agent", obj("resources", obj()))),

		// Durations and the fields that bound one another.
		specRow("refreshInterval 10ms", "spec.refreshInterval", obj("refreshInterval", "10ms")),
		specRow("refreshInterval 1m", "spec.refreshInterval", obj("refreshInterval", "1m")),
		specRow("refreshInterval 0", "spec.refreshInterval", obj("refreshInterval", 0)),
		specRow("refreshInterval 0.0", "spec.refreshInterval", obj("refreshInterval", 0.0)),
		specRow("overallTimeout 1ns", "spec.pull", pull("overallTimeout", "1ns")),
		specRow("overallTimeout below initialAttemptTimeout", "spec.pull", pull("initialAttemptTimeout", "10m", "maxAttemptTimeout", "10m", "overallTimeout", "5m")),
		specRow("initialAttemptTimeout above overallTimeout", "spec.pull", pull("initialAttemptTimeout", "30m", "maxAttemptTimeout", "30m")),
		specRow("initialAttemptTimeout above maxAttemptTimeout", "spec.pull", pull("initialAttemptTimeout", "10m", "maxAttemptTimeout", "5m")),
		specRow("initialRetryDelay above maxRetryDelay", "spec.pull", pull("initialRetryDelay", "5m", "maxRetryDelay", "1m")),
		specRow("every duration at its floor", "spec", merge(obj("refreshInterval", "1m"), pull("initialAttemptTimeout", "1s", "maxAttemptTimeout", "1s", "overallTimeout", "1m", "initialRetryDelay", "100ms", "maxRetryDelay", "100ms"))),
		specRow("seedNodes above maxConcurrentNodes", "spec.pull", pull("maxConcurrentNodes", 2, "seedNodes", 3)),
		specRow("seedNodes equal to maxConcurrentNodes", "spec.pull", pull("maxConcurrentNodes", 2, "seedNodes", 2)),
		specRow("largest cap", "spec.pull", pull("maxConcurrentNodes", 1000, "seedNodes", 1000)),

		// Selectors whose parts refer to one another.
		specJSON("matchLabelKeys without labelSelector", "spec.affinity", `{"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
			{"topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["app"]}]}}}`),
		specJSON("matchLabelKeys also in the selector", "spec.affinity", `{"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
			{"topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["app"], "labelSelector": {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "app", "operator": "Exists"}]}}]}}}`),
		specJSON("matchLabelKeys in the selector's expressions only", "spec.affinity", `{"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
			{"topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["app"], "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}]}}}`),
		specJSON("key in matchLabelKeys and mismatchLabelKeys", "spec.affinity", `{"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
			{"topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["app"], "mismatchLabelKeys": ["app"], "labelSelector": {"matchLabels": {"team": "x"}}}]}}}`),
		specJSON("Gt with two values", "spec.affinity", `{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["1", "2"]}]}]}}}}`),
		specJSON("Gt with a word", "spec.affinity", `{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}]}}}}`),
		specJSON("In without values", "spec.affinity", `{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}}`),
		specJSON("invalid label value, preferred term", "spec.affinity", `{"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
			{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["not valid!"]}]}}]}}}`),
		specJSON("node name field with two values", "spec.affinity", `{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}]}}}}`),
		specJSON("node name field, not a node name", "spec.affinity", `{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["Node_1"]}]}]}}}}`),
		specJSON("Lt toleration", "spec.tolerations", `{"tolerations": [{"key": "cores", "operator": "Lt", "value": "4"}]}`),

		// Labels of the ImagePrefetcher land on every object.
		row{name: "label key too long", at: "metadata.labels"}.with(func(d map[string]any) {
			d["metadata"].(map[string]any)["labels"] = obj("example.com/"+strings.Repeat("x", 64), "v")
		}),
	}

	// Names changed by kustomize before the function runs (namePrefix in the
	// kustomization that lists the function), and the namespace.
	lone := func(name, at, kustomization string, generator bool, edit func(d map[string]any)) row {
		r := row{name: name, at: at, alone: true, kustomization: kustomization, generator: generator}.with(edit)
		return r
	}
	named := func(n string) func(d map[string]any) {
		return func(d map[string]any) { d["metadata"].(map[string]any)["name"] = n }
	}
	rows = append(rows,
		lone("namePrefix to 63 characters", "metadata.name", "namePrefix: "+strings.Repeat("p", 60)+"\n", false, named("web")),
		lone("namePrefix past 63 characters", "metadata.name", "namePrefix: "+strings.Repeat("p", 61)+"\n", false, named("web")),
		lone("nameSuffix past 63 characters", "metadata.name", "nameSuffix: -"+strings.Repeat("s", 61)+"\n", false, named("web")),
		lone("kustomization namespace, transformer", "metadata.namespace", "namespace: "+namespace+"\n", false, func(d map[string]any) {
			named("web")(d)
			delete(d["metadata"].(map[string]any), "namespace")
		}),
		lone("kustomization namespace, generator", "metadata.namespace", "namespace: "+namespace+"\n", true, func(d map[string]any) {
			named("web")(d)
			delete(d["metadata"].(map[string]any), "namespace")
		}),
		lone("generator", "spec", "", true, named("gen")),
		lone("generator, 3,000 images", "spec.images", "", true, func(d map[string]any) {
			named("gen-big")(d)
			d["spec"].(map[string]any)["images"] = images(3000)
		}),
	)
	return rows
}
