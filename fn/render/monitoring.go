package render

import (
	"fmt"
	"maps"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// objectLabels are the labels of every rendered object and of the pod
// template: the user's (from the ImagePrefetcher), then the function's
// name, instance and managed-by on top. part-of, version and component
// stay the user's when set.
func (c Config) objectLabels() map[string]string {
	labels := Labels(c.Name)
	for k, v := range c.ExtraLabels {
		if !functionLabels[k] {
			labels[k] = v
		}
	}
	return labels
}

// podAnnotations are the user's annotations, as kustomize's
// commonAnnotations would put them on a pod template, with the function's
// own on top.
func (c Config) podAnnotations() map[string]string {
	a := map[string]string{}
	maps.Copy(a, c.ExtraAnnotations)
	a[ConfigHashAnnotation] = c.Hash()
	a["kubectl.kubernetes.io/default-container"] = "watch"
	return a
}

func (c Config) podPullSecrets() []corev1.LocalObjectReference {
	var refs []corev1.LocalObjectReference
	for _, s := range c.AgentPullSecrets {
		refs = append(refs, corev1.LocalObjectReference{Name: s})
	}
	return refs
}

// addMetrics turns on the agent's metrics server. Both containers serve it
// (fetch during the first pull, when slot waits and failures happen; then
// watch), one after the other on the same port, so the PodMonitor finds
// one target throughout. Only watch declares the port and has probes: an
// init container can have neither.
//
// /healthz answers as long as the agent process serves HTTP; it does not
// follow the node label, so a node whose images failed stays Ready and
// does not count against the DaemonSet's maxUnavailable.
func (c Config) addMetrics(ctr *corev1.Container) {
	if c.Metrics == nil {
		return
	}
	ctr.Args = append(ctr.Args, fmt.Sprintf("--metrics-addr=:%d", c.Metrics.Port))
	if ctr.Name != "watch" {
		return
	}
	ctr.Ports = []corev1.ContainerPort{{Name: MetricsPortName, ContainerPort: c.Metrics.Port, Protocol: corev1.ProtocolTCP}}
	probe := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/healthz", Port: intstr.FromString(MetricsPortName), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds:    period,
			TimeoutSeconds:   5,
			FailureThreshold: failures,
		}
	}
	ctr.LivenessProbe = probe(20, 3)
	ctr.ReadinessProbe = probe(10, 3)
}

// The PodMonitor and PrometheusRule, in the parts of the prometheus-operator
// types the function sets (monitoring.coreos.com/v1): like the SCC, the
// whole API is not worth a dependency of the function. The tests decode the
// output strictly into the operator's own types.
type podMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            podMonitorSpec    `json:"spec"`
}

type podMonitorSpec struct {
	Selector            metav1.LabelSelector `json:"selector"`
	PodMetricsEndpoints []podMetricsEndpoint `json:"podMetricsEndpoints"`
}

type podMetricsEndpoint struct {
	Port        string          `json:"port"`
	Path        string          `json:"path"`
	Relabelings []relabelConfig `json:"relabelings"`
}

type relabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	TargetLabel  string   `json:"targetLabel"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action"`
}

type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta  `json:"metadata"`
	Spec            prometheusRuleSpec `json:"spec"`
}

type prometheusRuleSpec struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// Target labels the PodMonitor adds to every series of the agent, and the
// alerts select on, with the target's namespace.
const (
	TargetLabelNode       = "node"
	TargetLabelPrefetcher = "prefetcher"
)

// monitoring renders the PodMonitor and the PrometheusRule, when asked for.
func (c Config) monitoring(meta metav1.ObjectMeta) []any {
	if c.Metrics == nil {
		return nil
	}
	var objs []any
	if c.Metrics.PodMonitor {
		instance := c.Name
		objs = append(objs, &podMonitor{
			TypeMeta: metav1.TypeMeta{APIVersion: "monitoring.coreos.com/v1", Kind: "PodMonitor"},
			Metadata: meta,
			Spec: podMonitorSpec{
				Selector: metav1.LabelSelector{MatchLabels: selectorLabels(c.Name)},
				PodMetricsEndpoints: []podMetricsEndpoint{{
					Port: MetricsPortName,
					Path: "/metrics",
					Relabelings: []relabelConfig{
						{SourceLabels: []string{"__meta_kubernetes_pod_node_name"}, TargetLabel: TargetLabelNode, Action: "replace"},
						// The instance as a value, not from a pod label: a
						// label transformer above the function cannot
						// change which alerts a series belongs to.
						{TargetLabel: TargetLabelPrefetcher, Replacement: &instance, Action: "replace"},
					},
				}},
			},
		})
	}
	if c.Metrics.Rules {
		objs = append(objs, &prometheusRule{
			TypeMeta: metav1.TypeMeta{APIVersion: "monitoring.coreos.com/v1", Kind: "PrometheusRule"},
			Metadata: meta,
			Spec:     prometheusRuleSpec{Groups: []ruleGroup{{Name: NamesFor(c.Namespace, c.Name).Cluster, Rules: c.alerts()}}},
		})
	}
	return objs
}

// Alert names of the PrometheusRule.
const (
	AlertNodeNotSucceeded       = "ImagePrefetcherNodeNotSucceeded"
	AlertImageFailingEverywhere = "ImagePrefetcherImageFailingEverywhere"
	AlertSlotStarvation         = "ImagePrefetcherSlotStarvation"
	AlertLabelConflict          = "ImagePrefetcherLabelConflict"
	AlertOwnerConflict          = "ImagePrefetcherOwnerConflict"
)

// Alert thresholds that do not follow from the spec.
const (
	// notSucceededWindow: the alert looks at the largest value over this
	// window, so a scrape gap (the agent restarting, fetch handing over to
	// watch) does not reset its clock.
	notSucceededWindow   = 10 * time.Minute
	slotStarvationFor    = 30 * time.Minute
	failingEverywhereFor = 15 * time.Minute
	labelConflictWindow  = 30 * time.Minute
	// ownerConflictWindow: fetch, which exits on a conflict and restarts
	// in a back-off, exposes the gauge only between restarts.
	ownerConflictWindow = 30 * time.Minute
)

// alerts are the rules of the PrometheusRule; docs/monitoring.md explains
// each one and its threshold.
func (c Config) alerts() []rule {
	sel := fmt.Sprintf(`namespace=%s,%s=%s`, strconv.Quote(c.Namespace), TargetLabelPrefetcher, strconv.Quote(c.Name))
	key := fmt.Sprintf("image-prefetcher.stackrox.io/%s", c.Name)
	labels := func(severity string) map[string]string {
		return map[string]string{"severity": severity}
	}
	return []rule{
		{
			// A node gets the whole overall timeout to pull before it
			// counts as late; the window adds its own length on top.
			Alert:  AlertNodeNotSucceeded,
			Expr:   fmt.Sprintf(`max_over_time(image_prefetcher_succeeded{%s}[%s]) == 0`, sel, promDuration(notSucceededWindow)),
			For:    promDuration(c.OverallTimeout),
			Labels: labels("warning"),
			Annotations: map[string]string{
				"summary":     fmt.Sprintf("Node {{ $labels.node }} has not had every image of %s/%s for a long time", c.Namespace, c.Name),
				"description": fmt.Sprintf("The image prefetcher %s/%s on node {{ $labels.node }} has not found every image of its list present for more than %s. Pods selecting %s=succeeded are not scheduled there. The node annotation %s lists the failed images and why.", c.Namespace, c.Name, promDuration(c.OverallTimeout+notSucceededWindow), key, key),
			},
		},
		{
			Alert: AlertImageFailingEverywhere,
			Expr: fmt.Sprintf("count by (namespace, %[2]s, image) (image_prefetcher_image_failed{%[1]s})\n  >= on (namespace, %[2]s) group_left ()\ncount by (namespace, %[2]s) (image_prefetcher_succeeded{%[1]s})",
				sel, TargetLabelPrefetcher),
			For:    promDuration(failingEverywhereFor),
			Labels: labels("critical"),
			Annotations: map[string]string{
				"summary":     fmt.Sprintf("Image {{ $labels.image }} of %s/%s fails on every node", c.Namespace, c.Name),
				"description": fmt.Sprintf("Every node running the image prefetcher %s/%s fails to pull {{ $labels.image }}: the reference, its credentials or the registry is wrong, not one node. No node can get the label %s=succeeded while it is in the list.", c.Namespace, c.Name, key),
			},
		},
		{
			Alert:  AlertSlotStarvation,
			Expr:   fmt.Sprintf(`image_prefetcher_slot_waiting{%s} == 1`, sel),
			For:    promDuration(slotStarvationFor),
			Labels: labels("warning"),
			Annotations: map[string]string{
				"summary":     fmt.Sprintf("Node {{ $labels.node }} has waited for a pull slot of %s/%s for over %s", c.Namespace, c.Name, promDuration(slotStarvationFor)),
				"description": fmt.Sprintf("The image prefetcher %s/%s on node {{ $labels.node }} cannot get one of the spec.pull.maxConcurrentNodes Lease slots. Slots held by nodes that pull slowly or a cap too low for the cluster starve the others (docs/herd.md).", c.Namespace, c.Name),
			},
		},
		{
			Alert:  AlertLabelConflict,
			Expr:   fmt.Sprintf(`increase(image_prefetcher_label_conflicts_total{%s}[%s]) > 0`, sel, promDuration(labelConflictWindow)),
			Labels: labels("warning"),
			Annotations: map[string]string{
				"summary":     fmt.Sprintf("Something other than the agent writes the node key %s on {{ $labels.node }}", key),
				"description": fmt.Sprintf("The image prefetcher %s/%s on node {{ $labels.node }} found its node label or annotation %s changed since it wrote it: by a person, a script or a controller labelling nodes, by status --cleanup, or by an agent of a release before key owners. The agent rewrites it at its next check, but a label that flips is not to be trusted. Another instance of the same name, or copy of this one, leaves a key it does not own alone (%s).", c.Namespace, c.Name, key, AlertOwnerConflict),
			},
		},
		{
			Alert: AlertOwnerConflict,
			Expr: fmt.Sprintf(`max_over_time(image_prefetcher_owner_conflict{%s}[%s]) == 1`,
				sel, promDuration(ownerConflictWindow)),
			Labels: labels("warning"),
			Annotations: map[string]string{
				"summary":     fmt.Sprintf("The node key %s on {{ $labels.node }} belongs to another instance than %s/%s", key, c.Namespace, c.Name),
				"description": fmt.Sprintf("The image prefetcher %s/%s on node {{ $labels.node }} leaves its node key %s alone: the key's annotation names another owner, an instance of the same name in another namespace or another copy (DaemonSet) of this one. Pods selecting the label follow the other owner's images. Give each instance its own name; the pod's Warning InstanceConflict Event names both owners.", c.Namespace, c.Name, key),
			},
		},
	}
}

// promDuration writes d the way Prometheus reads durations: "30m", "1h",
// "1h30m", never Go's "30m0s".
func promDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	var out string
	for _, u := range []struct {
		d time.Duration
		s string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if n := d / u.d; n > 0 {
			out += strconv.FormatInt(int64(n), 10) + u.s
			d -= n * u.d
		}
	}
	return out
}
