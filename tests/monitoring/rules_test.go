// Package monitoring_test checks the monitoring pack against the real agent:
// the PrometheusRule's alerts run in Prometheus's PromQL engine
// (ruleeval_test.go) on series taken from real scrapes of the agent's
// /metrics, and every metric the alerts and the Grafana dashboard use is one
// the agent exposes.
package monitoring_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
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
	agentBin := filepath.Join(bin, "image-prefetcher")
	if _, err := os.Stat(agentBin); err != nil {
		t.Fatalf("%s is missing: run `make build`", agentBin)
	}
	s := takeScrapes(t, agentBin)
	rules := renderedRules(t)
	t.Run("alerts", func(t *testing.T) { testAlerts(t, rules, s) })
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
	if probs.ExitCode() != 0 {
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

// seriesOf is the input of one node over its segments, one sample a
// minute from time 0: every series any segment has, with no sample in the
// minutes of a segment that lacks it.
func seriesOf(t *testing.T, node string, segs ...segment) []series {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	var keys []string
	for _, g := range segs {
		for k := range g.s {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	var out []series
	for _, k := range keys {
		lset, err := p.ParseMetric(withTarget(k, node))
		if err != nil {
			t.Fatalf("series %s: %v", k, err)
		}
		s := series{lset: lset}
		minute := 0
		for _, g := range segs {
			v, ok := g.s[k]
			for range g.minutes {
				if ok {
					s.samples = append(s.samples, fsample{t: (time.Duration(minute) * time.Minute).Milliseconds(), f: v})
				}
				minute++
			}
		}
		out = append(out, s)
	}
	return out
}

// alertCheck: at `at` after the start, the alert fires with exactly want
// (none: it does not fire).
type alertCheck struct {
	at    time.Duration
	alert string
	want  []string
}

type ruleTest struct {
	name   string
	input  []series
	checks []alertCheck
}

// testAlerts runs, for every alert, input that fires it, then resolves it,
// and input that never fires it, through Prometheus's rule evaluation
// (ruleeval_test.go), one evaluation a minute.
func testAlerts(t *testing.T, rules []byte, s Scrapes) {
	groups, annotations := ruleAnnotations(t, rules)
	expect := func(alert string, labels map[string]string, node, image string) string {
		l := map[string]string{"severity": groups[alert]}
		for k, v := range labels {
			l[k] = v
		}
		a := map[string]string{}
		for k, v := range annotations[alert] {
			v = strings.ReplaceAll(v, "{{ $labels.node }}", node)
			a[k] = strings.ReplaceAll(v, "{{ $labels.image }}", image)
		}
		return formatAlert(alert, l, a)
	}
	imageLabels := map[string]string{"namespace": namespace, "prefetcher": instance, "image": missing}
	cat := func(parts ...[]series) []series { return slices.Concat(parts...) }
	minute := func(m int) time.Duration { return time.Duration(m) * time.Minute }

	tests := []ruleTest{
		{
			name:  "node not succeeded: fires after the overall timeout, resolves when the node succeeds",
			input: seriesOf(t, "node-1", segment{s.Failed, 40}, segment{s.Succeeded, 20}),
			checks: []alertCheck{
				{minute(15), render.AlertNodeNotSucceeded, nil},
				{minute(31), render.AlertNodeNotSucceeded, []string{expect(render.AlertNodeNotSucceeded, targetMap("node-1"), "node-1", "")}},
				{minute(45), render.AlertNodeNotSucceeded, nil},
			},
		},
		{
			name: "node not succeeded: a succeeded node, and one that succeeded in between",
			input: cat(seriesOf(t, "node-1", segment{s.Succeeded, 60}),
				seriesOf(t, "node-2", segment{s.Failed, 15}, segment{s.Succeeded, 5}, segment{s.Failed, 40})),
			checks: []alertCheck{{minute(31), render.AlertNodeNotSucceeded, nil}},
		},
		{
			name: "image failing everywhere: every node fails it, until one has it",
			input: cat(seriesOf(t, "node-1", segment{s.Failed, 50}),
				seriesOf(t, "node-2", segment{s.Failed, 30}, segment{s.Succeeded, 20})),
			checks: []alertCheck{
				{minute(10), render.AlertImageFailingEverywhere, nil},
				{minute(20), render.AlertImageFailingEverywhere, []string{expect(render.AlertImageFailingEverywhere, imageLabels, "", missing)}},
				{minute(45), render.AlertImageFailingEverywhere, nil},
			},
		},
		{
			name:   "image failing everywhere: one node has it",
			input:  cat(seriesOf(t, "node-1", segment{s.Failed, 30}), seriesOf(t, "node-2", segment{s.Succeeded, 30})),
			checks: []alertCheck{{minute(20), render.AlertImageFailingEverywhere, nil}},
		},
		{
			name:  "slot starvation: waiting for over 30 minutes, until the slot comes",
			input: seriesOf(t, "node-1", segment{s.SlotWaiting, 40}, segment{s.Succeeded, 20}),
			checks: []alertCheck{
				{minute(25), render.AlertSlotStarvation, nil},
				{minute(35), render.AlertSlotStarvation, []string{expect(render.AlertSlotStarvation, targetMap("node-1"), "node-1", "")}},
				{minute(50), render.AlertSlotStarvation, nil},
			},
		},
		{
			name:   "slot starvation: the slot comes within 20 minutes",
			input:  seriesOf(t, "node-1", segment{s.SlotWaiting, 20}, segment{s.Succeeded, 20}),
			checks: []alertCheck{{minute(35), render.AlertSlotStarvation, nil}},
		},
		{
			name:  "label conflict: someone else rewrote the key, and 30 minutes later it is over",
			input: seriesOf(t, "node-1", segment{s.Succeeded, 10}, segment{s.Conflict, 40}),
			checks: []alertCheck{
				{minute(5), render.AlertLabelConflict, nil},
				{minute(15), render.AlertLabelConflict, []string{expect(render.AlertLabelConflict, targetMap("node-1"), "node-1", "")}},
				{minute(45), render.AlertLabelConflict, nil},
			},
		},
		{
			name:   "label conflict: nobody else writes",
			input:  seriesOf(t, "node-1", segment{s.Succeeded, 40}),
			checks: []alertCheck{{minute(15), render.AlertLabelConflict, nil}},
		},
		{
			name:  "owner conflict: another instance owns the key for 20 minutes, then this one writes it",
			input: seriesOf(t, "node-1", segment{s.Succeeded, 10}, segment{s.OwnerConflict, 20}, segment{s.Succeeded, 40}),
			checks: []alertCheck{
				{minute(5), render.AlertOwnerConflict, nil},
				{minute(15), render.AlertOwnerConflict,
					[]string{expect(render.AlertOwnerConflict, targetMap("node-1"), "node-1", "")}},
				{minute(65), render.AlertOwnerConflict, nil},
			},
		},
		{
			name:   "owner conflict: the key is this instance's, while someone else rewrites it",
			input:  seriesOf(t, "node-1", segment{s.Succeeded, 10}, segment{s.Conflict, 40}),
			checks: []alertCheck{{minute(15), render.AlertOwnerConflict, nil}},
		},
	}

	// Every alert fires, resolves later in the same test, and stays quiet in
	// another.
	const fires, resolves, quiet = 1, 2, 4
	covered := map[string]int{}
	for _, rt := range tests {
		fired := map[string]bool{}
		for _, c := range rt.checks {
			switch {
			case len(c.want) > 0:
				covered[c.alert] |= fires
				fired[c.alert] = true
			case fired[c.alert]:
				covered[c.alert] |= resolves
			default:
				if !slices.ContainsFunc(rt.checks, func(o alertCheck) bool { return o.alert == c.alert && len(o.want) > 0 }) {
					covered[c.alert] |= quiet
				}
			}
		}
	}
	for alert := range groups {
		if covered[alert] != fires|resolves|quiet {
			t.Errorf("alert %s lacks a case where it fires, resolves or never fires (have %03b)", alert, covered[alert])
		}
	}

	for _, rt := range tests {
		t.Run(rt.name, func(t *testing.T) {
			e, err := newEvaluator(rules, rt.input)
			if err != nil {
				t.Fatalf("%v\nrules:\n%s", err, rules)
			}
			checks := slices.Clone(rt.checks)
			slices.SortStableFunc(checks, func(a, b alertCheck) int { return int(a.at - b.at) })
			start := time.Unix(0, 0).UTC()
			ctx := t.Context()
			for ts := start; len(checks) > 0; ts = ts.Add(time.Minute) {
				if err := e.eval(ctx, ts); err != nil {
					t.Fatal(err)
				}
				for len(checks) > 0 && checks[0].at <= ts.Sub(start) {
					c := checks[0]
					checks = checks[1:]
					want := slices.Sorted(slices.Values(c.want))
					if got := e.firing(c.alert, ts); !slices.Equal(got, want) {
						t.Errorf("%s at %s: firing %s\nwant %s", c.alert, c.at, joinAlerts(got), joinAlerts(want))
					}
				}
			}
		})
	}
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
	for _, sc := range []Scrape{s.Succeeded, s.Conflict, s.OwnerConflict, s.Failed, s.SlotWaiting} {
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
