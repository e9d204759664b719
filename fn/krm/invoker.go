package krm

import (
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Invoker is the tool that runs the function. kpt keeps a package's files
// and shows the function's results itself; kustomize builds a stream and
// shows a function's stderr and nothing else.
type Invoker int

const (
	// Kustomize, also when the function is run by hand on a ResourceList.
	Kustomize Invoker = iota
	Kpt
)

func (i Invoker) String() string {
	if i == Kpt {
		return "kpt"
	}
	return "kustomize"
}

// Annotations that tell the invokers apart. Neither tool sets an
// environment variable for a function, so the ResourceList is the signal.
const (
	// kustomizeID is set by kustomize on every item it passes to a
	// transformer. kpt never sets it.
	kustomizeID = "kustomize.config.k8s.io/id"
	// seqIndent is set by kpt's reader on every object it reads (kpt fn
	// render, kpt fn eval on a directory or on stdin, kpt fn source), the
	// functionConfig included, so that its writer can restore each file's
	// list indentation. kustomize never sets it.
	seqIndent = "internal.config.kubernetes.io/seqindent"
)

// InvokedBy tells which tool runs the function from the items and the
// functionConfig it passed. kustomize's own mark wins; otherwise kpt's
// seqindent means kpt. A file path is no signal: the function's own output
// carries paths, and kustomize passes it to the next layer.
func InvokedBy(items []*yaml.RNode, fc *yaml.RNode) Invoker {
	kpt := fc != nil && fc.GetAnnotations()[seqIndent] != ""
	for _, it := range items {
		a := it.GetAnnotations()
		if a[kustomizeID] != "" {
			return Kustomize
		}
		kpt = kpt || a[seqIndent] != ""
	}
	if kpt {
		return Kpt
	}
	return Kustomize
}
