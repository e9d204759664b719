package krm

import (
	"bytes"
	"fmt"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
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
// kyaml's ByteReadWriter reads and writes, as kpt and kustomize do: items
// keep their order (the SDK's fn.Run sorts them) and their annotations,
// and both tools re-encode what the function writes anyway. Not kyaml's
// framework.Execute: its ReconcileInternalAnnotations drops the path and
// index this function puts on new objects for kpt (12 of the 33 render
// goldens came out without them).
func RunInvoked(in []byte) ([]byte, framework.Results, Invoker, error) {
	var out bytes.Buffer
	rw := &kio.ByteReadWriter{Reader: bytes.NewReader(in), Writer: &out, OmitReaderAnnotations: true, KeepReaderAnnotations: true}
	items, err := rw.Read()
	if err == nil && rw.WrappingKind != kio.ResourceListKind {
		err = fmt.Errorf("got kind %q", rw.WrappingKind)
	}
	if err != nil {
		return nil, nil, Kustomize, fmt.Errorf("read ResourceList: %w", err)
	}
	fc := rw.FunctionConfig
	if fc.IsNilOrEmpty() {
		fc = nil
	}
	by := InvokedBy(items, fc)
	items, results := expandAll(items, fc, by)
	// Results describe one invocation. Results already in the input come
	// from an earlier run (or another function): keeping them would repeat
	// each warning every time the function runs on its own output, and an
	// old error would fail a run that found nothing wrong.
	rw.Results = nil
	if len(results) > 0 {
		b, err := yaml.Marshal(results)
		if err != nil {
			return nil, nil, by, fmt.Errorf("write results: %w", err)
		}
		if rw.Results, err = yaml.Parse(string(b)); err != nil {
			return nil, nil, by, fmt.Errorf("write results: %w", err)
		}
	}
	if err := rw.Write(items); err != nil {
		return nil, nil, by, fmt.Errorf("write ResourceList: %w", err)
	}
	return out.Bytes(), results, by, nil
}
