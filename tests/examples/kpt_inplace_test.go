package examples_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// intent is one ImagePrefetcher of the package, as the user writes it.
type intent struct {
	file, namespace, name string
	flavor                string
	images                []string
	nodeLabel, admission  bool
	maxConcurrentNodes    int
	seedNodes             int
	// localConfig: the user marked the file config.kubernetes.io/local-config.
	// Without it, the function adds the mark.
	localConfig bool
	// startupTaint is spec.startupTaint.key, "" for none; narrow lists
	// one toleration of the user's own (dedicated) instead of the default
	// that tolerates every taint.
	startupTaint string
	narrow       bool
}

func (i intent) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The intent, kept in Git.\napiVersion: image-prefetcher.stackrox.io/v1alpha1\nkind: ImagePrefetcher\nmetadata:\n  name: %s\n  namespace: %s\n", i.name, i.namespace)
	if i.localConfig {
		b.WriteString("  annotations:\n    config.kubernetes.io/local-config: \"true\"\n")
	}
	b.WriteString("spec:\n")
	if i.flavor != "" {
		fmt.Fprintf(&b, "  flavor: %s\n", i.flavor)
	}
	b.WriteString("  images:\n")
	for _, img := range i.images {
		fmt.Fprintf(&b, "  - %s\n", img)
	}
	if !i.nodeLabel {
		b.WriteString("  nodeLabel:\n    enabled: false\n")
	}
	if !i.admission {
		b.WriteString("  admissionPolicy: false\n")
	}
	if i.startupTaint != "" {
		fmt.Fprintf(&b, "  startupTaint:\n    key: %s\n", i.startupTaint)
	}
	if i.narrow {
		b.WriteString("  tolerations:\n  - key: dedicated\n    operator: Exists\n")
	}
	if i.maxConcurrentNodes > 0 {
		fmt.Fprintf(&b, "  pull:\n    maxConcurrentNodes: %d\n", i.maxConcurrentNodes)
		if i.seedNodes > 0 {
			fmt.Fprintf(&b, "    seedNodes: %d\n", i.seedNodes)
		}
	}
	return b.String()
}

// outputFile is where the function writes what the intent renders.
func (i intent) outputFile() string {
	return path.Join(path.Dir(i.file), "image-prefetcher."+i.namespace+"."+i.name+".yaml")
}

// objects is what the intent renders, "Kind namespace/name", sorted: the
// table of docs/api.md (What it renders), written out independently of the
// function.
func (i intent) objects() []string {
	ns, n := i.namespace+"/image-prefetcher-"+i.name, "image-prefetcher."+i.namespace+"."+i.name
	objs := []string{"ServiceAccount " + ns, "Role " + ns, "RoleBinding " + ns, "ConfigMap " + ns + ".images", "DaemonSet " + ns, "ClusterRole " + n, "ClusterRoleBinding " + n}
	if i.nodeLabel && i.admission {
		objs = append(objs, "ValidatingAdmissionPolicy "+n, "ValidatingAdmissionPolicyBinding "+n)
	}
	if i.admission && i.maxConcurrentNodes > 0 {
		objs = append(objs, "ValidatingAdmissionPolicy "+n+".leases", "ValidatingAdmissionPolicyBinding "+n+".leases")
	}
	if i.flavor == "ocp" {
		objs = append(objs, "SecurityContextConstraints "+n, "Role "+ns+".scc", "RoleBinding "+ns+".scc")
	}
	slices.Sort(objs)
	return objs
}

// inplacePackage is the package in Git: the Kptfile, an unrelated file and
// the intents.
type inplacePackage struct {
	configPath bool
	intents    []intent
}

const inplaceNamespace = `# Unrelated to the function: must stay exactly as it is.
apiVersion: v1
kind: Namespace
metadata:
  name: prefetch # where the agents run
  labels:
    pod-security.kubernetes.io/enforce: privileged
`

func (p inplacePackage) kptfile() string {
	var b strings.Builder
	b.WriteString("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: prefetch\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\npipeline:\n  mutators:\n")
	if !p.configPath {
		b.WriteString("  - exec: image-prefetcher-fn\n")
		return b.String()
	}
	for _, i := range p.intents {
		fmt.Fprintf(&b, "  - exec: image-prefetcher-fn\n    configPath: %s\n", i.file)
	}
	return b.String()
}

// write puts the package's source files into dir, as the user's edit does:
// the Kptfile and the intents are rewritten, files of intents that are gone
// deleted. What the function rendered is left alone.
func (p inplacePackage) write(t *testing.T, dir string, previous inplacePackage) {
	t.Helper()
	files := map[string]string{"Kptfile": p.kptfile(), "namespace.yaml": inplaceNamespace}
	for _, i := range p.intents {
		files[i.file] = i.yaml()
	}
	for _, i := range previous.intents {
		if _, keep := files[i.file]; !keep {
			if err := os.Remove(filepath.Join(dir, i.file)); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeTree(t, dir, files)
}

// check asserts that dir holds exactly the package's sources and what its
// intents render, nothing else: every object that is not local-config is
// one the current intent renders, with the current settings.
func (p inplacePackage) check(t *testing.T, dir string) {
	t.Helper()
	tree := readTree(t, dir, nil)
	want := map[string][]string{"Kptfile": {"Kptfile prefetch"}, "namespace.yaml": {"Namespace prefetch"}}
	for _, i := range p.intents {
		want[i.file] = []string{"ImagePrefetcher " + i.namespace + "/" + i.name}
		want[i.outputFile()] = i.objects()
	}
	if got, w := slices.Sorted(mapKeys(tree)), slices.Sorted(mapKeys(want)); !slices.Equal(got, w) {
		t.Fatalf("files in the package:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(w, "\n  "))
	}
	if got := string(tree["namespace.yaml"]); got != inplaceNamespace {
		t.Errorf("namespace.yaml changed:\n%s", got)
	}
	byOutput := map[string]intent{}
	for _, i := range p.intents {
		byOutput[i.outputFile()] = i
	}
	for name, data := range tree {
		var got []string
		objs := decodeObjects(t, data)
		for _, o := range objs {
			key := o.GetKind() + " " + o.GetName()
			if o.GetNamespace() != "" {
				key = o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
			}
			got = append(got, key)
		}
		slices.Sort(got)
		if !slices.Equal(got, want[name]) {
			t.Errorf("%s holds\n  %s\nwant\n  %s", name, strings.Join(got, "\n  "), strings.Join(want[name], "\n  "))
		}
		i, rendered := byOutput[name]
		for _, o := range objs {
			local := o.GetAnnotations()["config.kubernetes.io/local-config"] == "true"
			switch {
			case o.GetKind() == "ImagePrefetcher" && !local:
				t.Errorf("%s: the ImagePrefetcher is not local-config: kpt live apply would send it to the cluster", name)
			case rendered && local:
				t.Errorf("%s: %s %s is local-config", name, o.GetKind(), o.GetName())
			case rendered && o.GetAnnotations()["image-prefetcher.stackrox.io/rendered-for"] != i.namespace+"/"+i.name:
				t.Errorf("%s: %s %s is not marked as rendered for %s/%s: %v", name, o.GetKind(), o.GetName(), i.namespace, i.name, o.GetAnnotations())
			}
			if !rendered {
				continue
			}
			// The objects carry the current settings, not an earlier render's.
			switch {
			case o.GetKind() == "ConfigMap":
				list, _, _ := unstructuredString(o.Object, "data", "images.txt")
				if want := strings.Join(i.images, "\n") + "\n"; list != want {
					t.Errorf("%s: ConfigMap lists\n%s\nwant\n%s", name, list, want)
				}
			case o.GetKind() == "ValidatingAdmissionPolicy" && strings.HasSuffix(o.GetName(), ".leases"):
				// The Role cannot name the queue's tickets: the Lease
				// policy names the slots the agent may write.
				text := fmt.Sprint(o.Object["spec"])
				slots := strings.Count(text, "'"+i.name+"-slot-")
				if slots != i.maxConcurrentNodes {
					t.Errorf("%s: the Lease policy names %d slots, want %d (maxConcurrentNodes): %s", name, slots, i.maxConcurrentNodes, text)
				}
			case o.GetKind() == "DaemonSet" && i.narrow:
				// Narrowed tolerations get the startup taints of the
				// package's instances now, never a key of an earlier
				// render's (an old key, a removed instance's).
				want := []string{"dedicated"}
				for _, other := range p.intents {
					if other.startupTaint != "" {
						want = append(want, other.startupTaint)
					}
				}
				slices.Sort(want)
				tols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "tolerations")
				var got []string
				for _, tol := range tols {
					got = append(got, fmt.Sprint(tol.(map[string]any)["key"]))
				}
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Errorf("%s: the DaemonSet tolerates %v, want %v", name, got, want)
				}
				fallthrough
			case o.GetKind() == "DaemonSet":
				text := fmt.Sprint(o.Object["spec"])
				if got, want := strings.Contains(text, fmt.Sprintf("--seed-nodes=%d", i.seedNodes)), i.seedNodes > 0; got != want {
					t.Errorf("%s: the DaemonSet has --seed-nodes=%d: %t, want %t", name, i.seedNodes, got, want)
				}
			}
		}
	}
}

func mapKeys[V any](m map[string]V) iter.Seq[string] { return maps.Keys(m) }

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// inplaceSteps is the sequence of edits between renders. Each step edits
// the intents of the step before.
var inplaceSteps = []struct {
	name string
	edit func([]intent) []intent
}{
	{"first render", func([]intent) []intent {
		return []intent{{file: "prefetcher.yaml", namespace: "prefetch", name: "web", images: []string{"registry.k8s.io/pause:3.10", "docker.io/library/busybox:1.37"},
			nodeLabel: true, admission: true, localConfig: true}}
	}},
	{"rename", func(is []intent) []intent { is[0].name = "web2"; return is }},
	{"flavor ocp", func(is []intent) []intent { is[0].flavor = "ocp"; return is }},
	{"flavor vanilla", func(is []intent) []intent { is[0].flavor = "vanilla"; return is }},
	{"admission policy off", func(is []intent) []intent { is[0].admission = false; return is }},
	{"admission policy on", func(is []intent) []intent { is[0].admission = true; return is }},
	{"node label off", func(is []intent) []intent { is[0].nodeLabel = false; return is }},
	{"node label on", func(is []intent) []intent { is[0].nodeLabel = true; return is }},
	{"herd: maxConcurrentNodes and seedNodes", func(is []intent) []intent {
		is[0].maxConcurrentNodes, is[0].seedNodes = 3, 1
		return is
	}},
	{"herd: fewer slots, no seed", func(is []intent) []intent {
		is[0].maxConcurrentNodes, is[0].seedNodes = 2, 0
		return is
	}},
	{"list: an image added, one removed", func(is []intent) []intent {
		is[0].images = []string{"docker.io/library/busybox:1.37", "quay.io/prometheus/busybox:latest"}
		return is
	}},
	{"a startup taint, tolerations narrowed", func(is []intent) []intent {
		is[0].startupTaint, is[0].narrow = "example.com/web-a", true
		return is
	}},
	{"the startup taint's key changed", func(is []intent) []intent { is[0].startupTaint = "example.com/web-b"; return is }},
	{"a second instance with a startup taint", func(is []intent) []intent {
		return append(is, intent{file: "taint/db.yaml", namespace: "prefetch", name: "db", images: []string{"registry.k8s.io/pause:3.10"},
			nodeLabel: true, admission: true, localConfig: true, startupTaint: "example.com/db", narrow: true})
	}},
	{"the second instance with a startup taint removed", func(is []intent) []intent { return is[:1] }},
	{"the instance moved to another directory", func(is []intent) []intent { is[0].file = "moved/web.yaml"; return is }},
	{"a second instance, in a directory, without local-config", func(is []intent) []intent {
		return append(is, intent{file: "apps/api.yaml", namespace: "prefetch", name: "api", flavor: "ocp",
			images: []string{"registry.k8s.io/pause:3.10"}, nodeLabel: true, admission: true})
	}},
	{"both edited: rename the first, shrink the second", func(is []intent) []intent {
		is[0].name = "web3"
		is[1].flavor, is[1].nodeLabel = "vanilla", false
		return is
	}},
	{"the first instance removed", func(is []intent) []intent { return is[1:] }},
	{"the instance back in the first file", func(is []intent) []intent {
		return []intent{{file: "prefetcher.yaml", namespace: "prefetch", name: "web", images: []string{"registry.k8s.io/pause:3.10"},
			nodeLabel: true, admission: true, localConfig: true}, is[0]}
	}},
}

// TestKptInPlace renders a package in place with the real kpt through a
// sequence of edits, as a kpt user keeps a package in Git: after each
// render the package holds exactly the intents, the unrelated file and what
// the current intents render, and a second render changes no byte. The
// same sequence through kpt fn source | kpt fn eval | kpt fn sink gives
// the same package, byte for byte.
func TestKptInPlace(t *testing.T) {
	tl := findTools(t)
	for _, configPath := range []bool{false, true} {
		t.Run(fmt.Sprintf("configPath=%t", configPath), func(t *testing.T) {
			t.Parallel() // two independent packages: one kpt each at a time
			render := filepath.Join(t.TempDir(), "render")
			evalDir := filepath.Join(t.TempDir(), "eval")
			for _, d := range []string{render, evalDir} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var prev inplacePackage
			var intents []intent
			for _, step := range inplaceSteps {
				intents = step.edit(slices.Clone(intents))
				pkg := inplacePackage{configPath: configPath, intents: intents}
				ok := t.Run(step.name, func(t *testing.T) {
					pkg.write(t, render, prev)
					tl.run(t, render, tl.env(), "kpt", "fn", "render", "--allow-exec", render)
					pkg.check(t, render)
					once := readTree(t, render, nil)
					tl.run(t, render, tl.env(), "kpt", "fn", "render", "--allow-exec", render)
					twice := readTree(t, render, nil)
					for name, b := range once {
						if !bytes.Equal(twice[name], b) {
							t.Errorf("a second render changed %s:\n%s", name, lineDiff(b, twice[name]))
						}
					}
					if len(twice) != len(once) {
						t.Errorf("a second render changed the files: %v", slices.Sorted(mapKeys(twice)))
					}

					// The same edit, then source | eval | sink into a new
					// directory that replaces the package.
					pkg.write(t, evalDir, prev)
					sunk := evalDir + ".new"
					tl.run(t, filepath.Dir(evalDir), tl.env(), "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
						fmt.Sprintf("kpt fn source %q | kpt fn eval - --exec image-prefetcher-fn | kpt fn sink %q", evalDir, sunk))
					if err := os.RemoveAll(evalDir); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(sunk, evalDir); err != nil {
						t.Fatal(err)
					}
					evaluated := readTree(t, evalDir, nil)
					for name, b := range twice {
						if !bytes.Equal(evaluated[name], b) {
							t.Errorf("source | eval | sink: %s differs from the render:\n%s", name, lineDiff(b, evaluated[name]))
						}
					}
					if len(evaluated) != len(twice) {
						t.Errorf("source | eval | sink: files %v, render: %v", slices.Sorted(mapKeys(evaluated)), slices.Sorted(mapKeys(twice)))
					}
				})
				if !ok {
					t.FailNow() // later steps build on this one
				}
				prev = pkg
			}
		})
	}
}

// runOutput runs argv and returns its stdout and stderr, and whether it
// exited 0: kpt reports a function's results on stderr.
func runOutput(t *testing.T, dir string, env []string, argv ...string) (string, string, bool) {
	t.Helper()
	prog, err := lookPathIn(argv[0], env)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	return stdout.String(), stderr.String(), err == nil
}

// TestKptInPlaceEdges: what a kpt user meets besides editing the intent.
func TestKptInPlaceEdges(t *testing.T) {
	tl := findTools(t)
	web := intent{file: "prefetcher.yaml", namespace: "prefetch", name: "web", images: []string{"registry.k8s.io/pause:3.10"}, nodeLabel: true, admission: true, localConfig: true}
	newPackage := func(t *testing.T, configPath bool) string {
		dir := filepath.Join(t.TempDir(), "pkg")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		inplacePackage{configPath: configPath, intents: []intent{web}}.write(t, dir, inplacePackage{})
		return dir
	}

	// kpt shows a function's results itself: a warning printed on stderr
	// too would show twice.
	t.Run("a warning is shown once", func(t *testing.T) {
		dir := newPackage(t, false)
		w := web
		w.admission = false
		inplacePackage{intents: []intent{w}}.write(t, dir, inplacePackage{})
		_, stderr, ok := runOutput(t, dir, tl.env(), "kpt", "fn", "render", "--allow-exec", dir)
		if !ok {
			t.Fatalf("kpt fn render failed:\n%s", stderr)
		}
		const warning = "spec.admissionPolicy: is false"
		if n := strings.Count(stderr, warning); n != 1 {
			t.Errorf("kpt shows the warning %d times, want once:\n%s", n, stderr)
		}
	})

	// The function's output file is image-prefetcher.<namespace>.<name>.yaml.
	// A file of the user's with that name is neither overwritten nor the
	// cause of kpt's "index already exists".
	t.Run("a user file with the output file's name", func(t *testing.T) {
		dir := newPackage(t, true)
		const mine = "# mine\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: mine\n  namespace: prefetch\n"
		if err := os.WriteFile(filepath.Join(dir, web.outputFile()), []byte(mine), 0o644); err != nil {
			t.Fatal(err)
		}
		before := readTree(t, dir, nil)
		_, stderr, ok := runOutput(t, dir, tl.env(), "kpt", "fn", "render", "--allow-exec", dir)
		if ok {
			t.Fatalf("kpt fn render succeeded:\n%s", stderr)
		}
		for _, want := range []string{`"image-prefetcher.prefetch.web.yaml"`, "image-prefetcher-fn writes", "ConfigMap prefetch/mine"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("kpt's output does not say %s:\n%s", want, stderr)
			}
		}
		if strings.Contains(stderr, "already exists") {
			t.Errorf("kpt failed on its own index check, not the function's:\n%s", stderr)
		}
		after := readTree(t, dir, nil)
		if len(after) != len(before) || !bytes.Equal(after[web.outputFile()], before[web.outputFile()]) {
			t.Errorf("a failed render changed the package: %v", slices.Sorted(mapKeys(after)))
		}
	})

	// kpt passes a step with selectors: or exclude: only the matching
	// resources and merges the step's output back by a resource id it sets
	// on them. The function then cannot see what it rendered before: it
	// refuses, with the fix, and the package stays as it was. (It once
	// copied kpt's id onto every rendered object, and kpt kept none of
	// them: the render passed and rendered nothing.)
	t.Run("selectors or exclude on the step", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			step string // appended to the function's step; "" runs kpt fn eval
			eval []string
		}{
			{name: "selectors", step: "    selectors:\n    - kind: ImagePrefetcher\n"},
			{name: "exclude", step: "    exclude:\n    - kind: Namespace\n"},
			{name: "eval --match-kind", eval: []string{"--match-kind", "ImagePrefetcher"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := newPackage(t, false)
				// Rendered once without a selection, as a package is
				// before someone adds one.
				tl.run(t, dir, tl.env(), "kpt", "fn", "render", "--allow-exec", dir)
				if tc.step != "" {
					kptfile := inplacePackage{intents: []intent{web}}.kptfile() + tc.step
					if err := os.WriteFile(filepath.Join(dir, "Kptfile"), []byte(kptfile), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				before := readTree(t, dir, nil)
				argv := []string{"kpt", "fn", "render", "--allow-exec", dir}
				if tc.eval != nil {
					argv = append([]string{"kpt", "fn", "eval", dir, "--exec", "image-prefetcher-fn"}, tc.eval...)
				}
				_, stderr, ok := runOutput(t, dir, tl.env(), argv...)
				if ok {
					t.Errorf("%s succeeded:\n%s", strings.Join(argv, " "), stderr)
				}
				for _, want := range []string{"[error]", "selectors: or exclude:", "needs the whole package", "remove selectors: and exclude: from the image-prefetcher-fn step"} {
					if !strings.Contains(stderr, want) {
						t.Errorf("kpt's output does not say %q:\n%s", want, stderr)
					}
				}
				after := readTree(t, dir, nil)
				if !maps.EqualFunc(before, after, bytes.Equal) {
					t.Errorf("the refused render changed the package: files %v, were %v", slices.Sorted(mapKeys(after)), slices.Sorted(mapKeys(before)))
				}
			})
		}
	})

	// kpt fn eval --fn-config F expands the ImagePrefetcher in F and no
	// other: the package's own intent and what it renders are not touched.
	t.Run("eval --fn-config", func(t *testing.T) {
		dir := newPackage(t, false)
		tl.run(t, dir, tl.env(), "kpt", "fn", "render", "--allow-exec", dir)
		// An edit of the package's intent that eval must not render.
		edited := web
		edited.images = append(edited.images, "docker.io/library/debian:bookworm")
		inplacePackage{intents: []intent{edited}}.write(t, dir, inplacePackage{})
		rendered := readTree(t, dir, nil)
		other := intent{file: "elsewhere.yaml", namespace: "prefetch", name: "other", images: []string{"docker.io/library/busybox:1.37"}, nodeLabel: true, admission: true}
		config := filepath.Join(t.TempDir(), other.file)
		if err := os.WriteFile(config, []byte(other.yaml()), 0o644); err != nil {
			t.Fatal(err)
		}
		tl.run(t, dir, tl.env(), "kpt", "fn", "eval", dir, "--exec", "image-prefetcher-fn", "--fn-config", config)
		after := readTree(t, dir, nil)
		for name, b := range rendered {
			if !bytes.Equal(after[name], b) {
				t.Errorf("eval --fn-config changed %s:\n%s", name, lineDiff(b, after[name]))
			}
		}
		got := decodeObjects(t, after["image-prefetcher.prefetch.other.yaml"])
		if len(got) != len(other.objects()) || len(after) != len(rendered)+1 {
			t.Errorf("eval --fn-config: files %v, %d objects for prefetch/other, want %d", slices.Sorted(mapKeys(after)), len(got), len(other.objects()))
		}
	})
}

// testKptLiveApply runs the workflow examples/kpt/README.md shows first on
// a real kube-apiserver: render in place, kpt live apply; edit, render,
// apply again. kpt live apply deploys exactly what the package holds
// besides local-config, so the cluster then holds exactly what the current
// intent renders: the renamed instance's old objects and the admission
// policy turned off are pruned from it.
func testKptLiveApply(t *testing.T, tl tools, api *apiServer) {
	kpt := func(t *testing.T, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := api.c.Command(ctx, tl.kpt, args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kpt %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	dir := filepath.Join(t.TempDir(), "pkg")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kpt(t, "live", "install-resource-group")
	web := intent{file: "prefetcher.yaml", namespace: "prefetch", name: "web", images: []string{"registry.k8s.io/pause:3.10"}, nodeLabel: true, admission: true, localConfig: true}
	var prev inplacePackage
	for i, step := range []func(intent) intent{
		func(i intent) intent { return i },
		func(i intent) intent { i.name = "web2"; return i },
		func(i intent) intent { i.admission = false; return i },
	} {
		web = step(web)
		pkg := inplacePackage{intents: []intent{web}}
		pkg.write(t, dir, prev)
		prev = pkg
		tl.run(t, dir, tl.env(), "kpt", "fn", "render", "--allow-exec", dir)
		if i == 0 {
			kpt(t, "live", "init", dir)
		}
		liveApply(t, api, tl, dir)
		// What the cluster holds of the function's objects.
		var got []string
		for _, gvr := range []schema.GroupVersionResource{
			{Version: "v1", Resource: "serviceaccounts"}, {Version: "v1", Resource: "configmaps"},
			{Group: "apps", Version: "v1", Resource: "daemonsets"},
			{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
			{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
			{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"},
			{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"},
		} {
			list, err := api.dyn.Resource(gvr).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=image-prefetcher-fn"})
			if err != nil {
				t.Fatalf("list %s: %v", gvr.Resource, err)
			}
			for _, o := range list.Items {
				key := o.GetKind() + " " + o.GetName()
				if o.GetNamespace() != "" {
					key = o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
				}
				got = append(got, key)
			}
		}
		slices.Sort(got)
		if want := web.objects(); !slices.Equal(got, want) {
			t.Errorf("step %d: the cluster holds\n  %s\nwant\n  %s", i, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
}

// liveApply runs kpt live apply. This control plane has no controllers, so
// a DaemonSet never reports its rollout and kpt gives up waiting for it
// (exit 3, "reconcile timeout"); everything else must apply, prune and
// reconcile.
func liveApply(t *testing.T, api *apiServer, tl tools, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := api.c.Command(ctx, tl.kpt, "live", "apply", "--reconcile-timeout=2s", dir).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 3) {
		t.Fatalf("kpt live apply: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.Contains(line, "reconcile timeout") && !strings.HasPrefix(line, "daemonset.apps/"),
			strings.Contains(line, " failed") && !strings.Contains(line, " 0 failed"):
			t.Errorf("kpt live apply: %s\n%s", line, out)
		}
	}
}
