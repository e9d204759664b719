// Package conformance holds the function's validation against the real
// kube-apiserver's: a large table of invalid and borderline
// ImagePrefetchers, most of them generated from the API types, is rendered
// with the real kustomize, and every row must either be rejected by the
// function at a field path, or render objects that a server-side dry-run
// apply on a real kube-apiserver (v1.36) accepts. No row may render cleanly
// and then be refused at sync time.
package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// Rows share kustomize runs, one ImagePrefetcher each, all expanded in
// transformer mode, each row's findings and objects told apart by its
// instance name. kustomize's cost grows with the square of the objects a
// function returns, so rendering happens in two passes: findPasses of
// findBatch rows plus a sentinel row the function always rejects, which
// makes kustomize stop right after the function has reported every row's
// findings; then the rows without findings, renderBatch at a time.
const (
	findBatch   = 250
	renderBatch = 15
)

func TestConformance(t *testing.T) {
	root := repoRoot(t)
	bin := func(name, how string) string {
		p := filepath.Join(root, "bin", name)
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("%s is missing: %s", p, how)
		}
		return p
	}
	r := renderer{fn: bin("image-prefetcher-fn", "run `make build`"), kustomize: bin("kustomize", "run `make tools`")}

	rows, uncovered := generatedRows()
	if len(uncovered) > 0 {
		t.Fatalf("fields of a kind the generator has no boundary values for (add them to rows_test.go):\n  %s", strings.Join(uncovered, "\n  "))
	}
	rows = append(rows, handRows()...)
	var batched, alone []*row
	for i := range rows {
		if rows[i].alone {
			alone = append(alone, &rows[i])
			continue
		}
		if !rows[i].ownName {
			rows[i].doc["metadata"].(map[string]any)["name"] = fmt.Sprintf("r%04d", i)
		}
		batched = append(batched, &rows[i])
	}

	start := time.Now()
	outcomes := map[*row]*outcome{}
	var clean []*row
	for i := 0; i < len(batched); i += findBatch {
		clean = append(clean, r.find(t, batched[i:min(i+findBatch, len(batched))], outcomes)...)
	}
	for i := 0; i < len(clean); i += renderBatch {
		r.batch(t, clean[i:min(i+renderBatch, len(clean))], outcomes, false)
	}
	for _, rw := range alone {
		r.batch(t, []*row{rw}, outcomes, false)
	}
	renderTime := time.Since(start)

	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	applier, err := c.NewApplier(cluster.ApplyOptions{DryRun: true, FieldManager: "conformance"})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	namespaces := map[string]error{}
	ensureNamespace := func(ns string) error {
		if err, done := namespaces[ns]; done {
			return err
		}
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		namespaces[ns] = err
		return err
	}

	// Objects that differ only by the row's instance name are the same
	// case for the apiserver: each shape is applied once.
	type job struct {
		rw  *row
		obj *unstructured.Unstructured
	}
	var jobs []job
	shapes := map[string]bool{}
	var rejected, rendered int
	var byKustomize []string
	for _, rw := range append(batched, alone...) {
		o := outcomes[rw]
		switch {
		case o == nil:
			t.Errorf("%s: no outcome", rw.name)
		case o.failure != "" && !strings.Contains(o.failure, "image-prefetcher-fn") && !strings.Contains(o.failure, "panic"):
			// kustomize itself refuses the input before the function runs
			// (a resource without metadata.name; an annotation key kustomize
			// re-reads as a number): nothing renders, the error comes at
			// render time.
			byKustomize = append(byKustomize, rw.name)
		case o.failure != "":
			t.Errorf("%s: kustomize failed without a finding of the function:\n%s", rw.name, o.failure)
		case len(o.errors) > 0:
			rejected++
			if !slicesAny(o.errors, func(p string) bool { return within(p, rw.at) }) {
				t.Errorf("%s: rejected, but at %s, not at or below %s", rw.name, strings.Join(o.errors, ", "), rw.at)
			}
		default:
			rendered++
			if len(o.objs) == 0 {
				t.Errorf("%s: neither rejected nor rendered", rw.name)
			}
			for _, obj := range o.objs {
				if ns := obj.GetNamespace(); ns != "" {
					if err := ensureNamespace(ns); err != nil {
						t.Errorf("%s: rendered into namespace %q, which the apiserver refuses: %v", rw.name, ns, err)
						continue
					}
				}
				key := shapeOf(rw, obj)
				if shapes[key] {
					continue
				}
				shapes[key] = true
				jobs = append(jobs, job{rw, obj})
			}
		}
	}

	applyStart := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	refused := 0
	unserved := map[string]bool{}
	work := make(chan job)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				_, err := applier.Apply(ctx, j.obj)
				if meta.IsNoMatchError(err) {
					// A kind of another platform or of a CRD the plain
					// apiserver does not serve (OpenShift's SCC): nothing
					// here can judge it.
					mu.Lock()
					unserved[j.obj.GroupVersionKind().String()] = true
					mu.Unlock()
					continue
				}
				if err != nil {
					mu.Lock()
					refused++
					t.Errorf("%s: rendered cleanly, but the apiserver refuses it: %v", j.rw.name, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	t.Logf("%d rows: %d rejected by the function at their field, %d refused by kustomize itself before the function ran (%s), %d rendered (%d distinct objects server-side dry-run applied, %d of them refused; kinds the apiserver does not serve, not judged: %s); rendering took %s, applying %s",
		len(rows), rejected, len(byKustomize), strings.Join(byKustomize, ", "), rendered, len(jobs), refused, strings.Join(slices.Sorted(maps.Keys(unserved)), ", "), renderTime.Round(time.Millisecond), time.Since(applyStart).Round(time.Millisecond))
}

// within reports whether the field path p is at or below the path at.
func within(p, at string) bool {
	return p == at || strings.HasPrefix(p, at+".") || strings.HasPrefix(p, at+"[")
}

func slicesAny(s []string, f func(string) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

// shapeOf is an object's JSON with the row's own instance name masked.
func shapeOf(rw *row, obj *unstructured.Unstructured) string {
	b, _ := json.Marshal(obj.Object)
	if rw.alone || rw.ownName {
		return fmt.Sprintf("%p", rw) + string(b) // names are what the row tests
	}
	name := rw.doc["metadata"].(map[string]any)["name"].(string)
	return strings.ReplaceAll(string(b), name, "@")
}

type outcome struct {
	errors  []string // field paths of the function's error findings
	objs    []*unstructured.Unstructured
	failure string // kustomize failed and no finding names this row
}

type renderer struct{ fn, kustomize string }

// sentinel is a row the function rejects, at spec.images.
var sentinel = row{name: "sentinel"}.with(func(d map[string]any) {
	d["metadata"].(map[string]any)["name"] = "sentinel"
	d["spec"].(map[string]any)["images"] = []any{}
})

// find records the rows the function rejects, and returns the others.
func (r renderer) find(t *testing.T, rows []*row, outcomes map[*row]*outcome) []*row {
	t.Helper()
	s := sentinel
	r.batch(t, append([]*row{&s}, rows...), outcomes, true)
	var clean []*row
	for _, rw := range rows {
		if outcomes[rw] == nil {
			clean = append(clean, rw)
		}
	}
	return clean
}

// batch renders rows in one kustomize run and records each row's outcome.
// When the run fails, the rows the function found errors in are done; the
// others are rendered again without them, unless findOnly (a sentinel
// run), which leaves them without an outcome.
func (r renderer) batch(t *testing.T, rows []*row, outcomes map[*row]*outcome, findOnly bool) {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, v any) {
		var b []byte
		switch v := v.(type) {
		case string:
			b = []byte(v)
		default:
			var err error
			if b, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	function := "config.kubernetes.io/function"
	exec := "exec:\n  path: " + r.fn + "\n"
	var k strings.Builder
	byName := map[string]*row{}
	if len(rows) == 1 && rows[0].generator {
		doc := deepCopy(rows[0].doc)
		meta := doc["metadata"].(map[string]any)
		meta["annotations"] = map[string]any{function: exec}
		write("prefetcher.json", doc)
		k.WriteString("generators:\n- prefetcher.json\n")
	} else {
		write("fn.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: image-prefetcher-fn\n  annotations:\n    "+function+": |\n      exec:\n        path: "+r.fn+"\n")
		// The ConfigMap every spec.imageListFrom row points at.
		write("images.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: images\n  namespace: "+namespace+"\ndata:\n  images.txt: |\n    busybox:1.37\n")
		k.WriteString("resources:\n- images.yaml\n")
		for i, rw := range rows {
			file := fmt.Sprintf("row%04d.json", i)
			write(file, rw.doc)
			k.WriteString("- " + file + "\n")
			if name, ok := rw.doc["metadata"].(map[string]any)["name"].(string); ok {
				byName[name] = rw
			}
		}
		k.WriteString("transformers:\n- fn.yaml\n")
	}
	if len(rows) == 1 {
		k.WriteString(rows[0].kustomization)
	}
	write("kustomization.yaml", k.String())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := execCommand(ctx, r.kustomize, "build", "--enable-alpha-plugins", "--enable-exec", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()

	if runErr == nil {
		objs, err := cluster.DecodeManifests(stdout.Bytes())
		if err != nil {
			t.Fatalf("decode kustomize output: %v", err)
		}
		for _, rw := range rows {
			outcomes[rw] = &outcome{}
		}
		for _, obj := range objs {
			if obj.GetKind() == "ConfigMap" && obj.GetName() == "images" {
				continue // the rows' input, not theirs
			}
			rw := byName[obj.GetLabels()["app.kubernetes.io/instance"]]
			if len(rows) == 1 {
				rw = rows[0]
			}
			if rw == nil {
				t.Errorf("an object no row rendered: %s %s", obj.GetKind(), obj.GetName())
				continue
			}
			outcomes[rw].objs = append(outcomes[rw].objs, obj)
		}
		return
	}

	// "image-prefetcher-fn: error: ImagePrefetcher <ns>/<name>: <path>: <message>"
	found := map[*row][]string{}
	for _, line := range strings.Split(stderr.String(), "\n") {
		rest, ok := strings.CutPrefix(line, "image-prefetcher-fn: error: ImagePrefetcher ")
		if !ok {
			continue
		}
		ref, rest, _ := strings.Cut(rest, ": ")
		// Under kustomize the function names the file after the object:
		// "<ns>/<name> (<file>)".
		ref, _, _ = strings.Cut(ref, " (")
		path, _, _ := strings.Cut(rest, ": ")
		rw := rows[0]
		if len(rows) > 1 {
			// "<ns>/<name>", or "<name>" without a namespace; both may hold
			// a '/', but a row that sets the name keeps the namespace, and
			// one that sets the namespace has a name without one.
			name, ok := strings.CutPrefix(ref, namespace+"/")
			if !ok {
				name = ref[strings.LastIndex(ref, "/")+1:]
			}
			if rw = byName[name]; rw == nil {
				t.Fatalf("a finding for no row: %s", line)
			}
		}
		found[rw] = append(found[rw], path)
	}
	var rest []*row
	for _, rw := range rows {
		if paths, ok := found[rw]; ok {
			if rw.name != sentinel.name {
				outcomes[rw] = &outcome{errors: paths}
			}
			continue
		}
		rest = append(rest, rw)
	}
	switch {
	case len(rest) == 0:
	case findOnly && len(rest) < len(rows):
		// The function ran: the rest have no findings.
	case len(rest) == 1 && len(rows) == 1:
		outcomes[rest[0]] = &outcome{failure: fmt.Sprintf("%v\n%s", runErr, stderr.String())}
	case len(rest) == len(rows):
		// kustomize failed before or after the function, naming no row:
		// halve until the failure has a row.
		if findOnly {
			rest = rest[1:] // the sentinel, not reported: the function did not run
			if len(rest) == 1 {
				r.batch(t, rest, outcomes, false)
				return
			}
			r.find(t, rest[:len(rest)/2], outcomes)
			r.find(t, rest[len(rest)/2:], outcomes)
			return
		}
		r.batch(t, rest[:len(rest)/2], outcomes, false)
		r.batch(t, rest[len(rest)/2:], outcomes, false)
	default:
		r.batch(t, rest, outcomes, false)
	}
}

func execCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, name, args...)
}

func deepCopy(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// repoRoot is the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}
