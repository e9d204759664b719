package krm

import (
	"bytes"
	"fmt"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/kio"
)

// Run reads a ResourceList, expands the ImagePrefetchers in it and writes
// the result.
func Run(in []byte) ([]byte, framework.Results, error) {
	out, results, _, err := RunInvoked(in)
	return out, results, err
}

// RunInvoked is Run that also tells which tool invoked the function, for
// the caller to decide where results are shown.
//
// kyaml's framework.Execute reads and writes the ResourceList: items keep
// their order and annotations, and it keeps kpt's file annotations in the
// form the input uses (internal.config.kubernetes.io/path and index, the
// config.kubernetes.io/ ones, or both); for an input without any, it drops
// the ones the function sets on new objects. Measured with kustomize
// v5.8.2 and kpt 1.0.0-beta.56 over every example, as kustomize build,
// kpt fn render (twice) and kpt fn source | eval | sink: the same trees,
// byte for byte, as a hand-written reader and writer that leaves
// annotations alone. Neither tool sends an input without them: kpt sends
// both forms of path and index, kustomize both forms of index.
func RunInvoked(in []byte) ([]byte, framework.Results, Invoker, error) {
	var out bytes.Buffer
	rw := &kio.ByteReadWriter{Reader: bytes.NewReader(in), Writer: &out, OmitReaderAnnotations: true, KeepReaderAnnotations: true}
	by := Kustomize
	var results framework.Results
	process := func(rl *framework.ResourceList) error {
		if rw.WrappingKind != kio.ResourceListKind {
			return fmt.Errorf("got kind %q, want %s", rw.WrappingKind, kio.ResourceListKind)
		}
		fc := rl.FunctionConfig
		if fc.IsNilOrEmpty() {
			fc = nil
		}
		by = InvokedBy(rl.Items, fc)
		rl.Items, results = expandAll(rl.Items, fc, by)
		rl.Results = results
		// Results describe one invocation. Results already in the input
		// come from an earlier run (or another function): Execute would
		// write them back when this run finds nothing, repeating each
		// warning every time the function runs on its own output, and an
		// old error would fail a run that found nothing wrong.
		rw.Results = nil
		return nil
	}
	if err := framework.Execute(framework.ResourceListProcessorFunc(process), rw); err != nil {
		return nil, nil, by, fmt.Errorf("ResourceList on stdin: %w", err)
	}
	return out.Bytes(), results, by, nil
}
