package examples_test

import (
	"encoding/json"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// strictMonitoring decodes a PodMonitor or PrometheusRule, kinds a plain
// apiserver does not serve, into the prometheus-operator's monitoring/v1
// types, rejecting any field they do not have, as strictSCC does for the
// OpenShift SCC.
func strictMonitoring(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	var into any
	switch o.GetKind() {
	case monitoringv1.PodMonitorsKind:
		into = &monitoringv1.PodMonitor{}
	case monitoringv1.PrometheusRuleKind:
		into = &monitoringv1.PrometheusRule{}
	default:
		t.Errorf("%s %s: unexpected kind of %s", o.GetKind(), o.GetName(), monitoringv1.SchemeGroupVersion)
		return
	}
	data, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Errorf("%s %s: strict decode into %T: %v", o.GetKind(), o.GetName(), into, err)
	}
	if o.GetNamespace() == "" {
		t.Errorf("%s %s: namespaced kind without a namespace", o.GetKind(), o.GetName())
	}
}
