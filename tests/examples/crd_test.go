package examples_test

import (
	"os"
	"path/filepath"
	"testing"
)

// crdFile is the ImagePrefetcher CRD users' tools read (docs/api.md).
const crdFile = "fn/api/crd/image-prefetcher.stackrox.io_imageprefetchers.yaml"

// TestCRDIsUpToDate generates the CRD from fn/api/v1alpha1 with the
// pinned controller-gen (make test-tools) and compares it with the checked-in
// one: `make crd` after a change of the API.
func TestCRDIsUpToDate(t *testing.T) {
	tl := findTools(t)
	gen := mustExecutable(t, filepath.Join(tl.bin, "controller-gen"), "run `make test-tools` to install controller-gen into ./bin")
	out := t.TempDir()
	env := append(tl.env(), "CONTROLLER_GEN="+gen)
	tl.run(t, tl.root, env, filepath.Join(tl.root, "fn/api/crd/generate.sh"), out)
	got, err := os.ReadFile(filepath.Join(out, filepath.Base(crdFile)))
	if err != nil {
		t.Fatal(err)
	}
	want := readFile(t, tl, crdFile)
	if string(got) != string(want) {
		t.Errorf("%s is not what fn/api/v1alpha1 generates; run `make crd`:\n%s", crdFile, lineDiff(want, got))
	}
}
