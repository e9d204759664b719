package render

import (
	"maps"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Label keys the user may set on the ImagePrefetcher to override the
// function's value; the other app.kubernetes.io labels are the function's.
const (
	LabelVersion   = "app.kubernetes.io/version"
	LabelComponent = "app.kubernetes.io/component"
)

// OSLabel is the well-known node label every kubelet sets. The agent is a
// Linux binary, and the default tolerations would otherwise put it on
// Windows nodes, where it never becomes ready and holds up rollouts.
const (
	OSLabel = "kubernetes.io/os"
	OSLinux = "linux"
)

// functionLabels are the labels whose values the function always sets:
// selectors and ownership checks rely on them.
var functionLabels = map[string]bool{LabelName: true, LabelInstance: true, LabelManagedBy: true}

// toolAnnotationPrefixes are annotation namespaces that belong to the
// function (the pod template's config hash must not be forged) and to kpt.
// With toolDomains and kubectl's last-applied copy, they never reach the
// rendered objects.
var toolAnnotationPrefixes = []string{
	v1alpha1.LabelDomain + "/",
	"kpt.dev/",
}

// toolDomains are the KRM tools' annotation domains. Every subdomain counts:
// kustomize writes file paths and build metadata under
// internal.config.kubernetes.io and alpha.config.kubernetes.io
// (buildMetadata: [transformerAnnotations]), hash requests under
// kustomize.config.k8s.io; kpt writes resource ids under
// internal.config.k8s.io when a pipeline step has selectors. They describe
// how the ImagePrefetcher was built, which changes with the source layout:
// copied onto the pod template they would roll every agent, and copied onto
// the rendered objects they would confuse the tools that wrote them (kpt
// maps a selected item's output back by its resource id).
var toolDomains = []string{"config.kubernetes.io", "config.k8s.io"}

const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// userAnnotation reports whether an annotation of the ImagePrefetcher is
// the user's, to be copied onto the rendered objects.
func userAnnotation(k string) bool {
	if k == lastApplied {
		return false
	}
	for _, p := range toolAnnotationPrefixes {
		if strings.HasPrefix(k, p) {
			return false
		}
	}
	if domain, _, prefixed := strings.Cut(k, "/"); prefixed {
		for _, d := range toolDomains {
			if domain == d || strings.HasSuffix(domain, "."+d) {
				return false
			}
		}
	}
	return true
}

// MetricsConfig is spec.metrics when enabled.
type MetricsConfig struct {
	Port       int32 `json:"port"`
	PodMonitor bool  `json:"podMonitor,omitempty"`
	Rules      bool  `json:"rules,omitempty"`
}

// MetricsPortName names the agent's metrics port; the PodMonitor and the
// probes refer to it by this name.
const MetricsPortName = "metrics"

// validatePlatform checks and applies what a platform team expects of a
// DaemonSet: metadata propagation, the pod's own pull secrets, the Linux
// node selector and the metrics endpoint.
func (c *Config) validatePlatform(ip *v1alpha1.ImagePrefetcher) framework.Results {
	var p framework.Results
	s := ip.Spec

	for _, k := range sortedKeys(ip.Metadata.Labels) {
		if functionLabels[k] {
			continue
		}
		if c.ExtraLabels == nil {
			c.ExtraLabels = map[string]string{}
		}
		c.ExtraLabels[k] = ip.Metadata.Labels[k]
	}
	for _, k := range sortedKeys(ip.Metadata.Annotations) {
		if !userAnnotation(k) {
			continue
		}
		if c.ExtraAnnotations == nil {
			c.ExtraAnnotations = map[string]string{}
		}
		c.ExtraAnnotations[k] = ip.Metadata.Annotations[k]
	}

	var sp framework.Results
	c.AgentPullSecrets, sp = secretNames("spec.agent.imagePullSecrets", s.Agent.ImagePullSecrets)
	p = append(p, sp...)

	// The user's own kubernetes.io/os, whatever its value, replaces the
	// default: that is the documented way out.
	if _, set := s.NodeSelector[OSLabel]; !set {
		sel := map[string]string{OSLabel: OSLinux}
		maps.Copy(sel, s.NodeSelector)
		c.NodeSelector = sel
	}

	m := s.Metrics
	enabled := m.Enabled != nil && *m.Enabled
	port := v1alpha1.DefaultMetricsPort
	if m.Port != nil {
		port = *m.Port
		if port < 1 || port > 65535 {
			p = append(p, errorf("spec.metrics.port", "must be between 1 and 65535, got %d", port))
		}
	}
	podMonitor, rules := m.PodMonitor != nil && *m.PodMonitor, m.Rules != nil && *m.Rules
	if !enabled {
		for _, f := range []struct {
			name string
			on   bool
		}{{"podMonitor", podMonitor}, {"rules", rules}} {
			if f.on {
				p = append(p, errorf("spec.metrics."+f.name, "needs spec.metrics.enabled: true: without it the agent serves no metrics"))
			}
		}
		return p
	}
	c.Metrics = &MetricsConfig{Port: port, PodMonitor: podMonitor, Rules: rules}
	if rules && !podMonitor {
		p = append(p, warnf("spec.metrics.rules", "is true without spec.metrics.podMonitor: the alerts select the agent's series by the target labels namespace and prefetcher=%q, which the rendered PodMonitor adds; make sure your own scrape configuration adds them too (docs/monitoring.md)", c.Name))
	}
	return p
}
