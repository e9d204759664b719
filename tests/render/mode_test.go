package render

import (
	"strings"
	"testing"
)

// TestKustomizeAnnotatedTransformer: the mode follows how kustomize invokes
// the function, not the shape of its config. An annotated ImagePrefetcher
// under transformers: expands every ImagePrefetcher of the resources as
// well as itself, and kustomize's needs-hash, which only a generator's
// output may carry, never reaches the output. A misspelled kind passes
// through with a warning on stderr.
func TestKustomizeAnnotatedTransformer(t *testing.T) {
	dir := copyTree(t, "testdata/kustomize/annotated-transformer")
	r := run(t, dir, kustomizeBinary(t), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	if r.err != nil {
		t.Fatalf("kustomize build: %v\n%s", r.err, r.stderr)
	}
	out := string(r.stdout)
	for _, want := range []string{"kind: DaemonSet\nmetadata:\n  labels:\n    app.kubernetes.io/instance: demo", "kind: DaemonSet\nmetadata:\n  labels:\n    app.kubernetes.io/instance: other"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "needs-hash") {
		t.Errorf("needs-hash in a transformer's output:\n%s", out)
	}
	if strings.Contains(out, "kind: ImagePrefetcher") {
		t.Errorf("an ImagePrefetcher was left unexpanded:\n%s", out)
	}
	if !strings.Contains(out, "kind: Imageprefetcher") {
		t.Errorf("the misspelled object did not pass through:\n%s", out)
	}
	want := `image-prefetcher-fn: warning: Imageprefetcher prefetch/typo: kind: kind "Imageprefetcher" is not a kind of image-prefetcher.stackrox.io (did you mean ImagePrefetcher?)`
	if !strings.Contains(string(r.stderr), want) {
		t.Errorf("stderr lacks the typo warning %q:\n%s", want, r.stderr)
	}
}
