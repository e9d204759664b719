// Package monitoring_test checks the monitoring pack against the real agent:
// the PrometheusRule's alerts run in the real Prometheus rule evaluator
// (promtool test rules) on series taken from real scrapes of the agent's
// /metrics, and every metric the alerts and the Grafana dashboard use is one
// the agent exposes.
package monitoring_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// dashboard is the Grafana dashboard shipped with the kustomize
// distribution, relative to the repository root.
const dashboard = "kustomize/monitoring/grafana-dashboard.json"

// TestMonitoring takes the scrapes once and runs both checks on them.
func TestMonitoring(t *testing.T) {
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	promtool := filepath.Join(bin, "promtool")
	if _, err := os.Stat(promtool); err != nil {
		t.Fatalf("%s is missing: run `make tools`", promtool)
	}
	agentBin := filepath.Join(bin, "image-prefetcher")
	if _, err := os.Stat(agentBin); err != nil {
		t.Fatalf("%s is missing: run `make build`", agentBin)
	}
	s := takeScrapes(t, agentBin)
	rules := renderedRules(t)
	t.Run("alerts", func(t *testing.T) { testAlerts(t, promtool, rules, s) })
	t.Run("metric-names", func(t *testing.T) { testMetricNames(t, rules, s) })
}

// renderedRules renders an ImagePrefetcher with the PrometheusRule and
// returns its rule groups as a Prometheus rule file.
func renderedRules(t *testing.T) []byte {
	t.Helper()
	on := true
	ip := &v1alpha1.ImagePrefetcher{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind,
		Spec: v1alpha1.Spec{Images: []string{present}, Metrics: v1alpha1.Metrics{Enabled: &on, PodMonitor: &on, Rules: &on}}}
	ip.Metadata.Name, ip.Metadata.Namespace = instance, namespace
	c, probs := render.Validate(ip, func(string, string) (map[string]string, bool) { return nil, false })
	if probs.HasErrors() {
		t.Fatalf("%+v", probs)
	}
	objs, err := render.Render(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		spec, err := o.Pipe(kyaml.Lookup("spec"))
		if err != nil || spec == nil {
			t.Fatalf("PrometheusRule without spec: %v", err)
		}
		return []byte(spec.MustString())
	}
	t.Fatal("no PrometheusRule rendered")
	return nil
}

// target is what Prometheus adds to a scraped series: the PodMonitor's
// relabelings (node, prefetcher) and the operator's target labels.
func target(node string) []string {
	return []string{
		`container="watch"`, `endpoint="metrics"`, `instance="10.88.0.` + strings.TrimPrefix(node, "node-") + `:9100"`,
		fmt.Sprintf(`job="%s/image-prefetcher-%s"`, namespace, instance), `namespace="` + namespace + `"`,
		`node="` + node + `"`, `pod="image-prefetcher-` + instance + `-` + node + `"`, `prefetcher="` + instance + `"`,
	}
}

func targetMap(node string) map[string]string {
	m := map[string]string{}
	for _, l := range target(node) {
		k, v, _ := strings.Cut(l, "=")
		m[k], _ = strconv.Unquote(v)
	}
	return m
}

// withTarget adds a target's labels to one exposed series.
func withTarget(series, node string) string {
	extra := strings.Join(target(node), ",")
	name, labels, ok := strings.Cut(series, "{")
	if !ok {
		return name + "{" + extra + "}"
	}
	return name + "{" + extra + "," + labels
}

// segment is a scrape that holds for some minutes, one sample a minute.
type segment struct {
	s       Scrape
	minutes int
}

// seriesOf is the promtool input of one node over its segments: every
// series any segment has, "_" (no sample) where a segment lacks it.
func seriesOf(node string, segs ...segment) []inputSeries {
	var keys []string
	for _, g := range segs {
		for k := range g.s {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	var out []inputSeries
	for _, k := range keys {
		var vals []string
		for _, g := range segs {
			v, ok := g.s[k]
			if !ok {
				vals = append(vals, fmt.Sprintf("_x%d", g.minutes))
				continue
			}
			vals = append(vals, fmt.Sprintf("%s+0x%d", strconv.FormatFloat(v, 'f', -1, 64), g.minutes-1))
		}
		out = append(out, inputSeries{Series: withTarget(k, node), Values: strings.Join(vals, " ")})
	}
	return out
}

type inputSeries struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

type alertTest struct {
	EvalTime  string     `json:"eval_time"`
	Alertname string     `json:"alertname"`
	ExpAlerts []expAlert `json:"exp_alerts"`
}

type expAlert struct {
	ExpLabels      map[string]string `json:"exp_labels"`
	ExpAnnotations map[string]string `json:"exp_annotations"`
}

type testGroup struct {
	Name           string        `json:"name"`
	Interval       string        `json:"interval"`
	InputSeries    []inputSeries `json:"input_series"`
	AlertRuleTests []alertTest   `json:"alert_rule_test"`
}

// testAlerts runs, for every alert, input that fires it and input that
// does not, through promtool test rules.
func testAlerts(t *testing.T, promtool string, rules []byte, s Scrapes) {
	groups, annotations := ruleAnnotations(t, rules)
	expect := func(alert string, labels map[string]string, node, image string) expAlert {
		l := map[string]string{"severity": groups[alert]}
		for k, v := range labels {
			l[k] = v
		}
		a := map[string]string{}
		for k, v := range annotations[alert] {
			v = strings.ReplaceAll(v, "{{ $labels.node }}", node)
			a[k] = strings.ReplaceAll(v, "{{ $labels.image }}", image)
		}
		return expAlert{ExpLabels: l, ExpAnnotations: a}
	}
	none := []expAlert{}
	imageLabels := map[string]string{"namespace": namespace, "prefetcher": instance, "image": missing}
	cat := func(parts ...[]inputSeries) []inputSeries { return slices.Concat(parts...) }

	tests := []testGroup{
		{
			Name: "node not succeeded: fires after the overall timeout", Interval: "1m",
			InputSeries: seriesOf("node-1", segment{s.Failed, 60}),
			AlertRuleTests: []alertTest{
				{EvalTime: "15m", Alertname: render.AlertNodeNotSucceeded, ExpAlerts: none},
				{EvalTime: "31m", Alertname: render.AlertNodeNotSucceeded, ExpAlerts: []expAlert{expect(render.AlertNodeNotSucceeded, targetMap("node-1"), "node-1", "")}},
			},
		},
		{
			Name: "node not succeeded: a succeeded node, and one that succeeded in between", Interval: "1m",
			InputSeries: cat(seriesOf("node-1", segment{s.Succeeded, 60}),
				seriesOf("node-2", segment{s.Failed, 15}, segment{s.Succeeded, 5}, segment{s.Failed, 40})),
			AlertRuleTests: []alertTest{{EvalTime: "31m", Alertname: render.AlertNodeNotSucceeded, ExpAlerts: none}},
		},
		{
			Name: "image failing everywhere: every node fails it", Interval: "1m",
			InputSeries: cat(seriesOf("node-1", segment{s.Failed, 30}), seriesOf("node-2", segment{s.Failed, 30})),
			AlertRuleTests: []alertTest{
				{EvalTime: "10m", Alertname: render.AlertImageFailingEverywhere, ExpAlerts: none},
				{EvalTime: "20m", Alertname: render.AlertImageFailingEverywhere, ExpAlerts: []expAlert{expect(render.AlertImageFailingEverywhere, imageLabels, "", missing)}},
			},
		},
		{
			Name: "image failing everywhere: one node has it", Interval: "1m",
			InputSeries:    cat(seriesOf("node-1", segment{s.Failed, 30}), seriesOf("node-2", segment{s.Succeeded, 30})),
			AlertRuleTests: []alertTest{{EvalTime: "20m", Alertname: render.AlertImageFailingEverywhere, ExpAlerts: none}},
		},
		{
			Name: "slot starvation: waiting for over 30 minutes", Interval: "1m",
			InputSeries: seriesOf("node-1", segment{s.SlotWaiting, 40}),
			AlertRuleTests: []alertTest{
				{EvalTime: "25m", Alertname: render.AlertSlotStarvation, ExpAlerts: none},
				{EvalTime: "35m", Alertname: render.AlertSlotStarvation, ExpAlerts: []expAlert{expect(render.AlertSlotStarvation, targetMap("node-1"), "node-1", "")}},
			},
		},
		{
			Name: "slot starvation: the slot comes within 20 minutes", Interval: "1m",
			InputSeries:    seriesOf("node-1", segment{s.SlotWaiting, 20}, segment{s.Succeeded, 20}),
			AlertRuleTests: []alertTest{{EvalTime: "35m", Alertname: render.AlertSlotStarvation, ExpAlerts: none}},
		},
		{
			Name: "label conflict: someone else rewrote the key, and 30 minutes later it is over", Interval: "1m",
			InputSeries: seriesOf("node-1", segment{s.Succeeded, 10}, segment{s.Conflict, 40}),
			AlertRuleTests: []alertTest{
				{EvalTime: "5m", Alertname: render.AlertLabelConflict, ExpAlerts: none},
				{EvalTime: "15m", Alertname: render.AlertLabelConflict, ExpAlerts: []expAlert{expect(render.AlertLabelConflict, targetMap("node-1"), "node-1", "")}},
				{EvalTime: "45m", Alertname: render.AlertLabelConflict, ExpAlerts: none},
			},
		},
		{
			Name: "label conflict: nobody else writes", Interval: "1m",
			InputSeries:    seriesOf("node-1", segment{s.Succeeded, 40}),
			AlertRuleTests: []alertTest{{EvalTime: "15m", Alertname: render.AlertLabelConflict, ExpAlerts: none}},
		},
	}
	covered := map[string]int{}
	for _, g := range tests {
		for _, a := range g.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				covered[a.Alertname] |= 1
			} else {
				covered[a.Alertname] |= 2
			}
		}
	}
	for alert := range groups {
		if covered[alert] != 3 {
			t.Errorf("alert %s lacks a firing or a non-firing case", alert)
		}
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	file := map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": tests}
	b, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tests.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s\nrules:\n%s", err, out, rules)
	}
	t.Logf("promtool test rules:\n%s", out)
}

// ruleAnnotations returns each alert's severity and annotations.
func ruleAnnotations(t *testing.T, rules []byte) (map[string]string, map[string]map[string]string) {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(rules, &f); err != nil {
		t.Fatal(err)
	}
	sev, ann := map[string]string{}, map[string]map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			sev[r.Alert], ann[r.Alert] = r.Labels["severity"], r.Annotations
		}
	}
	if len(sev) == 0 {
		t.Fatalf("no alerts in\n%s", rules)
	}
	return sev, ann
}

var metricName = regexp.MustCompile(`\bimage_prefetcher_[a-z_]+\b`)

// testMetricNames: every metric the alerts and the dashboard query is one
// the agent really exposes.
func testMetricNames(t *testing.T, rules []byte, s Scrapes) {
	exposed := map[string]bool{}
	for _, sc := range []Scrape{s.Succeeded, s.Conflict, s.Failed, s.SlotWaiting} {
		for n := range sc.Names() {
			exposed[n] = true
		}
	}
	check := func(where string, text string) {
		names := metricName.FindAllString(text, -1)
		if len(names) == 0 {
			t.Errorf("%s uses no agent metric", where)
		}
		for _, n := range names {
			if !exposed[n] {
				t.Errorf("%s uses %s, which the agent does not expose (exposed: %v)", where, n, slices.Sorted(maps.Keys(exposed)))
			}
		}
	}
	check("the PrometheusRule", string(rules))

	root, err := cluster.ProjectBinDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(root), dashboard))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	if len(d.Panels) == 0 {
		t.Fatalf("%s has no panels", dashboard)
	}
	for _, p := range d.Panels {
		if p.Targets == nil {
			continue // a row
		}
		var exprs []string
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
		check(fmt.Sprintf("%s panel %q", dashboard, p.Title), strings.Join(exprs, "\n"))
	}
}
