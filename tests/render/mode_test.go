package render

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// TestKustomizeAnnotatedTransformer: the mode follows how kustomize invokes
// the function, not the shape of its config. An annotated ImagePrefetcher
// under transformers: expands every ImagePrefetcher of the resources as
// well as itself, and kustomize's needs-hash, which only a generator's
// output may carry, never reaches the output. A misspelled kind among the
// resources fails the build, naming the field to change.
func TestKustomizeAnnotatedTransformer(t *testing.T) {
	dir := copyTree(t, "testdata/kustomize/annotated-transformer")
	r := run(t, dir, kustomizeBinary(t), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	if r.err != nil {
		t.Fatalf("kustomize build: %v\n%s", r.err, r.stderr)
	}
	out := string(r.stdout)
	daemonSets := map[string]bool{}
	for _, doc := range strings.Split(out, "\n---\n") {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("output is not YAML: %v\n%s", err, doc)
		}
		if obj.Kind == "DaemonSet" {
			daemonSets[obj.Metadata.Labels["app.kubernetes.io/instance"]] = true
		}
	}
	for _, want := range []string{"demo", "other"} {
		if !daemonSets[want] {
			t.Errorf("no DaemonSet for instance %s in the output:\n%s", want, out)
		}
	}
	if strings.Contains(out, "needs-hash") {
		t.Errorf("needs-hash in a transformer's output:\n%s", out)
	}
	if strings.Contains(out, "kind: ImagePrefetcher") {
		t.Errorf("an ImagePrefetcher was left unexpanded:\n%s", out)
	}
	kustomization := filepath.Join(dir, "kustomization.yaml")
	k, err := os.ReadFile(kustomization)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kustomization, []byte(strings.Replace(string(k), "- other.yaml\n", "- other.yaml\n- typo.yaml\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	r = run(t, dir, kustomizeBinary(t), "build", "--enable-alpha-plugins", "--enable-exec", ".")
	want := `image-prefetcher-fn: error: Imageprefetcher prefetch/typo (typo.yaml): kind: "Imageprefetcher" is not a kind of image-prefetcher.stackrox.io`
	if r.err == nil || !strings.Contains(string(r.stderr), want) {
		t.Errorf("a misspelled kind: %v, stderr lacks the error %q:\n%s", r.err, want, r.stderr)
	}
}
