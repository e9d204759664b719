package monitoring_test

// The alerts' evaluator: Prometheus's own rule-file parser, PromQL engine and
// template expander, over an in-memory storage of the scraped series, with
// the pending/firing state machine of an alerting rule. Prometheus's rules
// package (and promtool, and promqltest's storage) import its config
// package, which links every remote-write cloud SDK; these packages do not
// (checked by TestEvaluatorLinksNoDiscovery).

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/template"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// series is one input series: its labels and float samples, oldest first.
type series struct {
	lset    labels.Labels
	samples []chunks.Sample
}

type fsample struct {
	t int64
	f float64
}

func (s fsample) T() int64                      { return s.t }
func (s fsample) ST() int64                     { return 0 }
func (s fsample) F() float64                    { return s.f }
func (s fsample) H() *histogram.Histogram       { return nil }
func (s fsample) FH() *histogram.FloatHistogram { return nil }
func (s fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fsample) Copy() chunks.Sample           { return s }

// memStorage is a storage.Queryable and storage.Querier over fixed series.
type memStorage []series

func (m memStorage) Querier(int64, int64) (storage.Querier, error) { return m, nil }
func (m memStorage) Close() error                                  { return nil }

func (m memStorage) matching(ms []*labels.Matcher) []series {
	var out []series
	for _, s := range m {
		if !slices.ContainsFunc(ms, func(x *labels.Matcher) bool { return !x.Matches(s.lset.Get(x.Name)) }) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b series) int { return labels.Compare(a.lset, b.lset) })
	return out
}

func (m memStorage) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	return &seriesSet{list: m.matching(ms), i: -1}
}

func (m memStorage) LabelValues(_ context.Context, name string, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	var vals []string
	for _, s := range m.matching(ms) {
		if v := s.lset.Get(name); v != "" && !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	slices.Sort(vals)
	return vals, nil, nil
}

func (m memStorage) LabelNames(_ context.Context, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	var names []string
	for _, s := range m.matching(ms) {
		s.lset.Range(func(l labels.Label) {
			if !slices.Contains(names, l.Name) {
				names = append(names, l.Name)
			}
		})
	}
	slices.Sort(names)
	return names, nil, nil
}

type seriesSet struct {
	list []series
	i    int
}

func (s *seriesSet) Next() bool { s.i++; return s.i < len(s.list) }
func (s *seriesSet) At() storage.Series {
	return storage.NewListSeries(s.list[s.i].lset, s.list[s.i].samples)
}
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

// alertRule is one alerting rule of the file and the alerts it holds.
type alertRule struct {
	rulefmt.Rule
	// active: alert label set (as a string) to the alert.
	active map[string]*alert
}

type alert struct {
	labels, annotations labels.Labels
	activeAt            time.Time
}

// evaluator runs a rule file's alerting rules over an in-memory storage.
type evaluator struct {
	parser parser.Parser
	engine *promql.Engine
	store  memStorage
	rules  []*alertRule
}

// newEvaluator parses and validates the rule file as Prometheus does on
// load. Features this evaluator does not implement are refused, so that a
// rule using them cannot pass untested.
func newEvaluator(ruleFile []byte, store memStorage) (*evaluator, error) {
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.Parse(ruleFile, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, fmt.Errorf("rule file: %v", errs)
	}
	e := &evaluator{
		parser: p,
		engine: promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, Parser: p}),
		store:  store,
	}
	for _, g := range groups.Groups {
		if g.QueryOffset != nil || g.Limit != 0 || len(g.Labels) > 0 {
			return nil, fmt.Errorf("group %s: query_offset, limit and labels are not evaluated here", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || r.KeepFiringFor != 0 {
				return nil, fmt.Errorf("group %s: rule %q: only alerting rules without keep_firing_for are evaluated here", g.Name, r.Record+r.Alert)
			}
			e.rules = append(e.rules, &alertRule{Rule: r, active: map[string]*alert{}})
		}
	}
	return e, nil
}

func (e *evaluator) query(ctx context.Context, qs string, ts time.Time) (promql.Vector, error) {
	q, err := e.engine.NewInstantQuery(ctx, e.store, nil, qs, ts)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		return nil, res.Err
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v, nil
	case promql.Scalar:
		return promql.Vector{{T: v.T, F: v.V, Metric: labels.EmptyLabels()}}, nil
	default:
		return nil, fmt.Errorf("%q returned a %s, not a vector", qs, res.Value.Type())
	}
}

// eval evaluates every rule at ts, as rules.AlertingRule.Eval does: each
// result element is an alert, active since the first evaluation that
// returned it; one that no longer returns is gone.
func (e *evaluator) eval(ctx context.Context, ts time.Time) error {
	for _, r := range e.rules {
		res, err := e.query(ctx, r.Expr, ts)
		if err != nil {
			return fmt.Errorf("alert %s at %s: %w", r.Alert, ts.UTC().Format(time.TimeOnly), err)
		}
		seen := map[string]bool{}
		for _, smpl := range res {
			data := template.AlertTemplateData(smpl.Metric.Map(), nil, "", smpl)
			expand := func(text string) (string, error) {
				defs := "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
				return template.NewTemplateExpander(ctx, defs+text, "__alert_"+r.Alert, data,
					model.Time(ts.UnixMilli()), e.query, nil, nil).Expand()
			}
			lb := labels.NewBuilder(smpl.Metric)
			lb.Del(labels.MetricName)
			for k, v := range r.Labels {
				x, err := expand(v)
				if err != nil {
					return fmt.Errorf("alert %s label %s: %w", r.Alert, k, err)
				}
				lb.Set(k, x)
			}
			lb.Set(labels.AlertName, r.Alert)
			ann := labels.NewBuilder(labels.EmptyLabels())
			for k, v := range r.Annotations {
				x, err := expand(v)
				if err != nil {
					return fmt.Errorf("alert %s annotation %s: %w", r.Alert, k, err)
				}
				ann.Set(k, x)
			}
			lset := lb.Labels()
			key := lset.String()
			if seen[key] {
				return fmt.Errorf("alert %s: two results with the labels %s", r.Alert, key)
			}
			seen[key] = true
			if a, ok := r.active[key]; ok {
				a.annotations = ann.Labels()
				continue
			}
			r.active[key] = &alert{labels: lset, annotations: ann.Labels(), activeAt: ts}
		}
		for key := range r.active {
			if !seen[key] {
				delete(r.active, key)
			}
		}
	}
	return nil
}

// firing returns the alerts of the rule named alertname that fire at ts:
// active for at least the rule's `for`.
func (e *evaluator) firing(alertname string, ts time.Time) []string {
	var out []string
	for _, r := range e.rules {
		if r.Alert != alertname {
			continue
		}
		for _, a := range r.active {
			if ts.Sub(a.activeAt) >= time.Duration(r.For) {
				out = append(out, a.labels.String()+" "+a.annotations.String())
			}
		}
	}
	slices.Sort(out)
	return out
}

// formatAlert writes an expected alert the way firing does.
func formatAlert(alertname string, lbls, anns map[string]string) string {
	l := labels.FromMap(lbls)
	b := labels.NewBuilder(l)
	b.Set(labels.AlertName, alertname)
	return b.Labels().String() + " " + labels.FromMap(anns).String()
}

// joinAlerts is a readable list of alerts for failure messages.
func joinAlerts(as []string) string {
	if len(as) == 0 {
		return "(none)"
	}
	return "\n\t" + strings.Join(as, "\n\t")
}

// TestEvaluatorLinksNoDiscovery keeps the alerts' test from linking what
// promtool does: Prometheus's service discovery, its config package and the
// cloud SDKs they bring, which made the test's build minutes long.
func TestEvaluatorLinksNoDiscovery(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-test", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := regexp.MustCompile(`^(github\.com/prometheus/prometheus/((discovery|config|notifier|rules)(/|$)|tsdb$)|github\.com/Azure/|github\.com/aws/|cloud\.google\.com/|google\.golang\.org/api/)`)
	for _, pkg := range strings.Fields(string(out)) {
		if forbidden.MatchString(pkg) {
			t.Errorf("the test binary links %s", pkg)
		}
	}
}
