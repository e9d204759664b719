package render

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/kyaml/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

func withMeta(labels, annotations map[string]string) *v1alpha1.ImagePrefetcher {
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind, Spec: v1alpha1.Spec{Images: []string{"debian:12"}}}
	ip.Metadata.Name, ip.Metadata.Namespace = "demo", "prefetch"
	ip.Metadata.Labels, ip.Metadata.Annotations = labels, annotations
	return ip
}

func validated(t *testing.T, ip *v1alpha1.ImagePrefetcher) Config {
	t.Helper()
	c, probs := Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.ExitCode() != 0 {
		t.Fatalf("unexpected problems: %+v", probs)
	}
	return c
}

// TestMetadataPropagation: the user's labels and annotations reach every
// rendered object and the pod template, the tools' annotations do not, and
// the function's name, instance and managed-by win while part-of, version
// and component are the user's. The DaemonSet selector never moves.
func TestMetadataPropagation(t *testing.T) {
	on := true
	ip := withMeta(map[string]string{
		LabelName: "x", LabelInstance: "y", LabelManagedBy: "kustomize",
		LabelPartOf: "platform-tools", LabelVersion: "2.4", LabelComponent: "cache",
		"kustomize.toolkit.fluxcd.io/name": "infra",
	}, map[string]string{
		"argocd.argoproj.io/sync-wave":                     "-1",
		"config.kubernetes.io/local-config":                "true",
		"config.kubernetes.io/function":                    "exec: {path: x}",
		"internal.config.kubernetes.io/path":               "a.yaml",
		"config.k8s.io/id":                                 "1",
		"alpha.config.kubernetes.io/transformations":       "- configuredIn: kustomization.yaml",
		"internal.config.k8s.io/kpt-resource-id":           "0",
		"kustomize.config.k8s.io/needs-hash":               "true",
		"kpt.dev/config-injection":                         "required",
		"kubectl.kubernetes.io/last-applied-configuration": "{}",
		ConfigHashAnnotation:                               "forged",
	})
	ip.Spec.Flavor = v1alpha1.FlavorOCP
	ip.Spec.Metrics = v1alpha1.Metrics{Enabled: &on, PodMonitor: &on, Rules: &on}
	objs, err := Render(validated(t, ip))
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		LabelName: AppName, LabelInstance: "demo", LabelManagedBy: ManagedBy,
		LabelPartOf: "platform-tools", LabelVersion: "2.4", LabelComponent: "cache",
		"kustomize.toolkit.fluxcd.io/name": "infra",
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		id := o.GetKind() + " " + o.GetName()
		if got := o.GetLabels(); !equalMaps(got, wantLabels) {
			t.Errorf("%s: labels %v, want %v", id, got, wantLabels)
		}
		a := o.GetAnnotations()
		if a["argocd.argoproj.io/sync-wave"] != "-1" {
			t.Errorf("%s: sync-wave annotation missing: %v", id, a)
		}
		for k := range a {
			if !userAnnotation(k) || strings.HasPrefix(k, v1alpha1.LabelDomain+"/") {
				t.Errorf("%s: carries %s", id, k)
			}
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "DaemonSet",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "SecurityContextConstraints", "PodMonitor", "PrometheusRule"} {
		if !kinds[k] {
			t.Errorf("no %s rendered; the test covers every kind", k)
		}
	}

	ds := decodeDaemonSet(t, objs)
	if got := ds.Spec.Selector.MatchLabels; !equalMaps(got, map[string]string{LabelName: AppName, LabelInstance: "demo"}) {
		t.Errorf("selector %v moved", got)
	}
	if got := ds.Spec.Template.Labels; !equalMaps(got, wantLabels) {
		t.Errorf("pod template labels %v, want %v", got, wantLabels)
	}
	pa := ds.Spec.Template.Annotations
	if pa["argocd.argoproj.io/sync-wave"] != "-1" || pa[ConfigHashAnnotation] == "forged" || pa[ConfigHashAnnotation] == "" {
		t.Errorf("pod template annotations %v", pa)
	}
	if want := []string{"argocd.argoproj.io/sync-wave", ConfigHashAnnotation, v1alpha1.ListDigestAnnotation, "kubectl.kubernetes.io/default-container", "openshift.io/required-scc"}; !slices.Equal(slices.Sorted(maps.Keys(pa)), want) {
		t.Errorf("pod template annotations %v, want exactly %v", slices.Sorted(maps.Keys(pa)), want)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func decodeDaemonSet(t *testing.T, objs []*yaml.RNode) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			var ds appsv1.DaemonSet
			strictDecode(t, o, &ds)
			return &ds
		}
	}
	t.Fatal("no DaemonSet")
	return nil
}

func strictDecode(t *testing.T, o *yaml.RNode, into any) {
	t.Helper()
	j, err := o.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.UnmarshalStrict(j, into); err != nil {
		t.Fatalf("%s %s: strict decode into %T: %v", o.GetKind(), o.GetName(), into, err)
	}
}

// TestLinuxNodeSelector: kubernetes.io/os: linux is merged into the user's
// selector, and a kubernetes.io/os of the user's own replaces it.
func TestLinuxNodeSelector(t *testing.T) {
	for _, tc := range []struct {
		name string
		sel  map[string]string
		want map[string]string
	}{
		{"default", nil, map[string]string{OSLabel: OSLinux}},
		{"merged", map[string]string{"disk": "ssd"}, map[string]string{OSLabel: OSLinux, "disk": "ssd"}},
		{"user's own os", map[string]string{OSLabel: "plan9"}, map[string]string{OSLabel: "plan9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := withMeta(nil, nil)
			ip.Spec.NodeSelector = tc.sel
			objs, err := Render(validated(t, ip))
			if err != nil {
				t.Fatal(err)
			}
			if got := decodeDaemonSet(t, objs).Spec.Template.Spec.NodeSelector; !equalMaps(got, tc.want) {
				t.Errorf("nodeSelector %v, want %v", got, tc.want)
			}
			if tc.sel != nil && len(ip.Spec.NodeSelector) != len(tc.sel) {
				t.Errorf("the ImagePrefetcher's own map was changed: %v", ip.Spec.NodeSelector)
			}
		})
	}
}

// TestMonitoringObjectsDecodeStrictly decodes the PodMonitor and the
// PrometheusRule into the prometheus-operator's own types, rejecting any
// field those do not have, and checks what the agent and the alerts rely
// on: the port name, the target labels and one rule per alert.
func TestMonitoringObjectsDecodeStrictly(t *testing.T) {
	on, port := true, int32(9464)
	ip := withMeta(nil, nil)
	ip.Spec.Metrics = v1alpha1.Metrics{Enabled: &on, Port: &port, PodMonitor: &on, Rules: &on}
	objs, err := Render(validated(t, ip))
	if err != nil {
		t.Fatal(err)
	}
	var pm *monitoringv1.PodMonitor
	var pr *monitoringv1.PrometheusRule
	for _, o := range objs {
		switch o.GetKind() {
		case monitoringv1.PodMonitorsKind:
			pm = &monitoringv1.PodMonitor{}
			strictDecode(t, o, pm)
		case monitoringv1.PrometheusRuleKind:
			pr = &monitoringv1.PrometheusRule{}
			strictDecode(t, o, pr)
		}
	}
	if pm == nil || pr == nil {
		t.Fatalf("PodMonitor %v, PrometheusRule %v", pm != nil, pr != nil)
	}
	for _, o := range []struct{ apiVersion, ns string }{{pm.APIVersion, pm.Namespace}, {pr.APIVersion, pr.Namespace}} {
		if o.apiVersion != monitoringv1.SchemeGroupVersion.String() || o.ns != "prefetch" {
			t.Errorf("apiVersion %s namespace %s", o.apiVersion, o.ns)
		}
	}
	if got := pm.Spec.Selector.MatchLabels; !equalMaps(got, map[string]string{LabelName: AppName, LabelInstance: "demo"}) {
		t.Errorf("PodMonitor selects %v", got)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("endpoints %+v", pm.Spec.PodMetricsEndpoints)
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	if ep.Port == nil || *ep.Port != MetricsPortName || ep.Path != "/metrics" {
		t.Errorf("endpoint %+v", ep)
	}
	targets := map[string]bool{}
	for _, r := range ep.RelabelConfigs {
		targets[r.TargetLabel] = true
	}
	if !targets[TargetLabelNode] || !targets[TargetLabelPrefetcher] {
		t.Errorf("relabelings %+v do not set %s and %s", ep.RelabelConfigs, TargetLabelNode, TargetLabelPrefetcher)
	}

	ds := decodeDaemonSet(t, objs)
	watch := ds.Spec.Template.Spec.Containers[0]
	if len(watch.Ports) != 1 || watch.Ports[0].Name != MetricsPortName || watch.Ports[0].ContainerPort != port {
		t.Errorf("watch ports %+v", watch.Ports)
	}
	for _, ctr := range append(ds.Spec.Template.Spec.InitContainers, watch) {
		if !strings.Contains(strings.Join(ctr.Args, " "), "--metrics-addr=:9464") {
			t.Errorf("%s args %v lack --metrics-addr", ctr.Name, ctr.Args)
		}
	}

	if len(pr.Spec.Groups) != 1 {
		t.Fatalf("groups %+v", pr.Spec.Groups)
	}
	alerts := map[string]monitoringv1.Rule{}
	for _, r := range pr.Spec.Groups[0].Rules {
		alerts[r.Alert] = r
		if !strings.Contains(r.Expr.String(), `namespace="prefetch",prefetcher="demo"`) {
			t.Errorf("%s does not select this instance's series: %s", r.Alert, r.Expr.String())
		}
		if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s lacks severity, summary or description", r.Alert)
		}
	}
	for _, a := range []string{
		AlertNodeNotSucceeded, AlertImageFailingEverywhere, AlertSlotStarvation, AlertLabelConflict, AlertOwnerConflict,
	} {
		if _, ok := alerts[a]; !ok {
			t.Errorf("no alert %s", a)
		}
	}
	if f := alerts[AlertNodeNotSucceeded].For; f == nil || string(*f) != "20m" {
		t.Errorf("%s for %v, want the overall timeout 20m", AlertNodeNotSucceeded, f)
	}
}

// TestMonitoringDoesNotRoll: the PodMonitor and the PrometheusRule live
// beside the DaemonSet, so switching them does not restart the agents;
// switching metrics on does.
func TestMonitoringDoesNotRoll(t *testing.T) {
	on := true
	enabled := withMeta(nil, nil)
	enabled.Spec.Metrics = v1alpha1.Metrics{Enabled: &on}
	full := withMeta(nil, nil)
	full.Spec.Metrics = v1alpha1.Metrics{Enabled: &on, PodMonitor: &on, Rules: &on}
	off := validated(t, withMeta(nil, nil)).Hash()
	if a, b := validated(t, enabled).Hash(), validated(t, full).Hash(); a != b || a == off {
		t.Errorf("hash metrics on %s, with monitoring objects %s, off %s", a, b, off)
	}
}

// TestAgentPullSecrets: spec.agent.imagePullSecrets become the pod's
// imagePullSecrets, and spec.imagePullSecrets do not.
func TestAgentPullSecrets(t *testing.T) {
	ip := withMeta(nil, nil)
	ip.Spec.ImagePullSecrets = []string{"for-the-list"}
	ip.Spec.Agent.ImagePullSecrets = []string{"mirror", "fallback"}
	objs, err := Render(validated(t, ip))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(decodeDaemonSet(t, objs).Spec.Template.Spec.ImagePullSecrets)
	if string(got) != `[{"name":"mirror"},{"name":"fallback"}]` {
		t.Errorf("pod imagePullSecrets %s", got)
	}
}
