package render

import (
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// strictMonitoring decodes a rendered PodMonitor or PrometheusRule into the
// prometheus-operator's monitoring/v1 types, rejecting any field they do
// not have, as the SCC is decoded into OpenShift's.
func strictMonitoring(t *testing.T, file, kind string, doc []byte) {
	t.Helper()
	var into any
	switch kind {
	case monitoringv1.PodMonitorsKind:
		into = &monitoringv1.PodMonitor{}
	case monitoringv1.PrometheusRuleKind:
		into = &monitoringv1.PrometheusRule{}
	default:
		t.Errorf("%s: unexpected monitoring.coreos.com kind %s", file, kind)
		return
	}
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Errorf("%s: %s does not decode strictly into %T: %v", file, kind, into, err)
	}
}
