// Package docs_test checks that the docs keep everything a user needs: every
// flag of fetch, watch and status, every field of the ImagePrefetcher API,
// every metric, every reason the agent writes and every exit code appears
// in docs/, each list taken from the code; and that every relative link of
// the docs and the README resolves, anchor included.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/image-prefetcher/image-prefetcher/agent/cli"
	"github.com/image-prefetcher/image-prefetcher/agent/metrics"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Page budgets (issue 37): docs a reader finishes. Every page counts,
// docs/integrations/ included. Issue 51 added install.md.
const (
	maxTotalLines = 3050
	maxPageLines  = 450
	maxTesting    = 250
)

// pages returns docs/*.md and docs/*/*.md, by path relative to docs/.
func pages(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".md") {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no pages under docs/")
	}
	return out
}

func allText(t *testing.T) string {
	ps := pages(t)
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(ps)) {
		b.WriteString(ps[p])
	}
	return b.String()
}

// backticked returns every `code span` of the docs, with a{b,c} expanded
// to ab and ac, and [] (a list's element) dropped.
func backticked(text string) map[string]bool {
	spans := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(text, -1) {
		for _, s := range expandBraces(strings.ReplaceAll(m[1], "[]", "")) {
			spans[s] = true
		}
	}
	return spans
}

func expandBraces(s string) []string {
	i := strings.IndexByte(s, '{')
	j := strings.IndexByte(s, '}')
	if i < 0 || j < i {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(s[i+1:j], ",") {
		for _, rest := range expandBraces(s[j+1:]) {
			out = append(out, s[:i]+strings.TrimSpace(alt)+rest)
		}
	}
	return out
}

func TestFlagsDocumented(t *testing.T) {
	text := allText(t)
	root := cli.New(cli.Deps{})
	for _, name := range []string{"fetch", "watch", "status"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil || cmd.Name() != name {
			t.Fatalf("no %s command: %v", name, err)
		}
		n := 0
		check := func(f *pflag.Flag) {
			n++
			// Hidden, not deprecated: a seam for tests, not for users.
			// Deprecated flags are hidden too and stay documented.
			if f.Hidden && f.Deprecated == "" {
				return
			}
			if !regexp.MustCompile("`--" + regexp.QuoteMeta(f.Name) + "[`= \\[]").MatchString(text) {
				t.Errorf("%s --%s is not in docs/ (as `--%s`)", name, f.Name, f.Name)
			}
		}
		cmd.LocalFlags().VisitAll(check)
		cmd.InheritedFlags().VisitAll(check)
		if n == 0 {
			t.Errorf("%s has no flags: the command lookup is broken", name)
		}
	}
}

// apiFields returns the JSON path of every field under t, down to fields
// whose type is not one of the API package's own structs.
func apiFields(prefix string, t reflect.Type) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[v1alpha1.Spec]().PkgPath() {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" && f.Anonymous {
			out = append(out, apiFields(prefix, f.Type)...)
			continue
		}
		p := prefix + "." + name
		out = append(out, p)
		out = append(out, apiFields(p, f.Type)...)
	}
	return out
}

// TestAPIFieldsDocumented: each field is in docs/ by its path
// (`spec.pull.parallelism`, `spec.credentialProvider.{configPath,binDir}`),
// or by its name on a line that names its parent's path.
func TestAPIFieldsDocumented(t *testing.T) {
	text := allText(t)
	spans := backticked(text)
	lines := strings.Split(text, "\n")
	fields := apiFields("spec", reflect.TypeFor[v1alpha1.Spec]())
	if len(fields) < 20 {
		t.Fatalf("only %d API fields found: %v", len(fields), fields)
	}
	for _, p := range fields {
		// A field with fields of its own is documented by theirs.
		if spans[p] || slices.ContainsFunc(fields, func(c string) bool { return strings.HasPrefix(c, p+".") }) {
			continue
		}
		parent, name := p[:strings.LastIndexByte(p, '.')], p[strings.LastIndexByte(p, '.')+1:]
		if slices.ContainsFunc(lines, func(l string) bool {
			s := backticked(l)
			return s[parent] && s[name]
		}) {
			continue
		}
		t.Errorf("API field %s is not in docs/ (as `%s`, or `%s` on a line with `%s`)", p, p, name, parent)
	}
}

// TestMetricsDocumented: each metric as `name` or `name{labels}`.
func TestMetricsDocumented(t *testing.T) {
	text := allText(t)
	m := metrics.New()
	v := reflect.ValueOf(m).Elem()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	n := 0
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok || v.Field(i).Type() == reflect.TypeFor[*prometheus.Registry]() {
			continue
		}
		// A field that is not registered would not be exposed: the list
		// is the registry's.
		if err := m.Registry.Register(c); err == nil {
			t.Errorf("metrics.Metrics.%s is not registered", v.Type().Field(i).Name)
			continue
		}
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			name := fqName.FindStringSubmatch(d.String())
			if name == nil {
				t.Fatalf("no fqName in %s", d)
			}
			n++
			if !regexp.MustCompile("`" + regexp.QuoteMeta(name[1]) + "[`{]").MatchString(text) {
				t.Errorf("metric %s is not in docs/ (as `%s`)", name[1], name[1])
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d metrics found", n)
	}
}

// constants returns the exported constants of the Go packages under dirs
// whose names start with prefix, by value as written (a string or an
// integer literal).
func constants(t *testing.T, prefix string, dirs ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join("..", dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "internal") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, id := range vs.Names {
						if !id.IsExported() || !strings.HasPrefix(id.Name, prefix) {
							continue
						}
						var lit ast.Expr
						if i < len(vs.Values) {
							lit = vs.Values[i]
						}
						bl, ok := lit.(*ast.BasicLit)
						if !ok {
							t.Errorf("%s: the value of %s is not a literal; read it some other way here", p, id.Name)
							continue
						}
						v := bl.Value
						if s, err := strconv.Unquote(v); err == nil {
							v = s
						}
						out[p+": "+id.Name] = v
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestReasonsDocumented: every reason the agent writes (the node
// annotation's failed and not-pinned images, Events, metric labels).
func TestReasonsDocumented(t *testing.T) {
	spans := backticked(allText(t))
	reasons := constants(t, "Reason", "agent", "fn")
	if len(reasons) < 10 {
		t.Fatalf("only %d reasons found: %v", len(reasons), reasons)
	}
	for where, r := range reasons {
		if !spans[r] {
			t.Errorf("reason %s (%s) is not in docs/ (as `%s`)", r, where, r)
		}
	}
}

// TestExitCodesDocumented: every exit code has a row in a table under an
// "Exit codes" heading.
func TestExitCodesDocumented(t *testing.T) {
	codes := constants(t, "Exit", "agent/cli")
	if len(codes) < 4 {
		t.Fatalf("only %d exit codes found: %v", len(codes), codes)
	}
	rows := map[string]bool{}
	row := regexp.MustCompile(`^\|\s*` + "`?" + `(\d+)` + "`?" + `\s*\|`)
	for _, text := range pages(t) {
		in := false
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "#") {
				in = strings.Contains(strings.ToLower(l), "exit code")
			}
			if m := row.FindStringSubmatch(l); in && m != nil {
				rows[m[1]] = true
			}
		}
	}
	for where, c := range codes {
		if !rows[c] {
			t.Errorf("exit code %s (%s) has no row in an Exit codes table of docs/", c, where)
		}
	}
}

// TestPageBudgets: docs/ stays a size a reader finishes.
func TestPageBudgets(t *testing.T) {
	total := 0
	for p, text := range pages(t) {
		n := strings.Count(text, "\n")
		total += n
		limit := maxPageLines
		if p == "testing.md" {
			limit = maxTesting
		}
		if n > limit {
			t.Errorf("docs/%s has %d lines, over its %d", p, n, limit)
		}
	}
	if total > maxTotalLines {
		t.Errorf("docs/ has %d lines, over %d", total, maxTotalLines)
	}
}

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		s := slug(strings.TrimLeft(l, "#"))
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestLinks: every relative link of the repository's pages (docs/, the
// READMEs) names a file that exists and, for a page, a heading it has.
func TestLinks(t *testing.T) {
	all := map[string]string{}
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "out" || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		b, err := os.ReadFile(p)
		all[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for p, text := range all {
		text = regexp.MustCompile("(?s)```.*?```").ReplaceAllString(text, "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := p
			if file != "" {
				path = filepath.Join(filepath.Dir(p), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links %s, which does not exist", p, target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s links %s: %v", p, target, err)
				continue
			}
			if !anchors(string(b))[anchor] {
				t.Errorf("%s links %s, but %s has no heading #%s", p, target, path, anchor)
			}
		}
	}
}
