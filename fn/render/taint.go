package render

import (
	"fmt"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// StartupTaintConfig is spec.startupTaint with its default applied.
type StartupTaintConfig struct {
	Key string `json:"key"`
	// MaxWait 0 keeps the taint until every image is present.
	MaxWait time.Duration `json:"maxWait"`
}

// startupTaintFile is where the agent's first container records when the
// pod started, in the pod's emptyDir: a restarted container then keeps the
// maxWait clock instead of starting it again.
const startupTaintFile = "/tmp/pod-started-at"

// validateStartupTaint checks spec.startupTaint and makes sure the agent
// tolerates the taint it is meant to remove. It runs after the tolerations
// and the node label setting are known.
func (c *Config) validateStartupTaint(s v1alpha1.Spec) framework.Results {
	st := s.StartupTaint
	if st == nil {
		return nil
	}
	var p framework.Results
	cfg := &StartupTaintConfig{Key: st.Key}
	switch {
	case st.Key == "":
		p = append(p, errorf("spec.startupTaint.key", "is required when startupTaint is set: the key of the taint new nodes register with, e.g. startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher"))
	default:
		if errs := validation.IsQualifiedName(st.Key); len(errs) > 0 {
			p = append(p, errorf("spec.startupTaint.key", "%q is not a valid taint key: %s", st.Key, strings.Join(errs, "; ")))
		} else if owner := v1alpha1.TaintOwner(st.Key); owner != "" {
			p = append(p, errorf("spec.startupTaint.key", "%q is a taint owned by %s, which sets and removes it: the agent removing it would undo that state; use a key of your own, e.g. startup-taint.cluster-autoscaler.kubernetes.io/image-prefetcher", st.Key, owner))
		}
	}
	maxWait := st.MaxWait
	if maxWait == "" {
		maxWait = v1alpha1.DefaultStartupTaintMaxWait
	}
	d, err := time.ParseDuration(maxWait)
	switch {
	case err != nil:
		p = append(p, errorf("spec.startupTaint.maxWait", "%q is not a duration: use a Go duration such as 90s, 5m or 1h30m, or 0 to keep the taint until every image is present", maxWait))
	case d < 0:
		p = append(p, errorf("spec.startupTaint.maxWait", "must not be negative, got %q", maxWait))
	}
	cfg.MaxWait = d
	if !c.NodeLabel {
		p = append(p, errorf("spec.startupTaint", "needs spec.nodeLabel.enabled: the agent removes the taint once its node label says succeeded, with the node access that labeling grants"))
	}
	c.StartupTaint = cfg

	// The default tolerates every taint. A narrowed list must still let the
	// agent onto a node that carries the taint, or nothing would remove it;
	// and onto one that also carries another instance's startup taint, or
	// each agent waits for the other's taint to go, for ever.
	if s.Tolerations != nil && st.Key != "" {
		for _, key := range slices.Compact(slices.Sorted(slices.Values(append([]string{st.Key}, c.startupTaintKeys...)))) {
			if slices.ContainsFunc(c.Tolerations, func(t corev1.Toleration) bool { return toleratesEveryEffect(t, key) }) {
				continue
			}
			c.Tolerations = append(slices.Clone(c.Tolerations), corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists})
			why := "the agent must run on the nodes that carry the taint to remove it"
			if key != st.Key {
				why = "another instance in the ResourceList has that startup taint, and on a node with both neither agent would start otherwise"
			}
			p = append(p, warnf("spec.tolerations", "does not tolerate the startup taint %s with every effect: the DaemonSet also gets {key: %s, operator: Exists}, because %s", key, key, why))
		}
	}
	return p
}

// StartupTaintKeys are the startup-taint keys of the ImagePrefetchers in
// items and of the DaemonSets rendered for an instance before (a lower
// kustomize layer), from the agent's --startup-taint flag.
func StartupTaintKeys(items []*yaml.RNode) []string {
	var keys []string
	for _, n := range items {
		switch {
		case n == nil:
		case n.GetKind() == v1alpha1.Kind:
			if k, _ := n.Pipe(yaml.Lookup("spec", "startupTaint", "key")); k != nil && yaml.GetValue(k) != "" {
				keys = append(keys, yaml.GetValue(k))
			}
		case n.GetKind() == "DaemonSet" && n.GetLabels()[LabelManagedBy] == ManagedBy:
			ctrs, _ := n.Pipe(yaml.Lookup("spec", "template", "spec", "containers"))
			for _, ctr := range ctrs.Content() {
				args, _ := yaml.NewRNode(ctr).Pipe(yaml.Lookup("args"))
				for _, a := range args.Content() {
					if k, ok := strings.CutPrefix(a.Value, "--startup-taint="); ok {
						keys = append(keys, k)
					}
				}
			}
		}
	}
	return keys
}

// Untolerated are the keys a rendered DaemonSet with a startup taint does
// not tolerate with every effect; nil for one without a startup taint.
func Untolerated(ds *yaml.RNode, keys []string) []string {
	if len(StartupTaintKeys([]*yaml.RNode{ds})) == 0 {
		return nil
	}
	tols, _ := ds.Pipe(yaml.Lookup("spec", "template", "spec", "tolerations"))
	var missing []string
	for _, key := range keys {
		if !slices.ContainsFunc(tols.Content(), func(n *yaml.Node) bool {
			var t corev1.Toleration
			return n.Decode(&t) == nil && toleratesEveryEffect(t, key)
		}) {
			missing = append(missing, key)
		}
	}
	return missing
}

// toleratesEveryEffect reports whether t tolerates a taint with key and any
// value and effect.
func toleratesEveryEffect(t corev1.Toleration, key string) bool {
	return t.Operator == corev1.TolerationOpExists && (t.Key == "" || t.Key == key) && t.Effect == ""
}

// startupTaintFlags are the agent's flags for the startup taint.
func (c Config) startupTaintFlags() []string {
	if c.StartupTaint == nil {
		return nil
	}
	return []string{
		"--startup-taint=" + c.StartupTaint.Key,
		"--startup-taint-max-wait=" + c.StartupTaint.MaxWait.String(),
		"--pod-start-file=" + startupTaintFile,
	}
}

// specValidation is the admission rule on the Node's spec. Without a
// startup taint the spec must not change at all. With one, every spec
// field but taints must stay as it was; the taints are checked by
// startupTaintValidations. The fields are compared as a map, key by key,
// rather than by name, so that a field this function does not know of
// (one a newer apiserver adds) is covered too.
func (c Config) specValidation() admissionv1.Validation {
	if c.StartupTaint == nil {
		return admissionv1.Validation{Expression: "object.spec == oldObject.spec", Message: "the image prefetcher may not change the node's spec"}
	}
	return admissionv1.Validation{
		Expression: "variables.newSpec.all(f, f == 'taints' || (f in variables.oldSpec && variables.oldSpec[f] == variables.newSpec[f])) && variables.oldSpec.all(f, f == 'taints' || f in variables.newSpec)",
		Message:    "the image prefetcher may not change the node's spec, apart from removing its startup taint " + c.StartupTaint.Key,
	}
}

// startupTaintVariables and startupTaintValidations let the agent remove
// taints with the startup taint's key, and nothing else: every taint left
// was there before, unchanged, and every taint that went had that key.
func (c Config) startupTaintVariables() []admissionv1.Variable {
	if c.StartupTaint == nil {
		return nil
	}
	return []admissionv1.Variable{
		{Name: "taintKey", Expression: fmt.Sprintf("'%s'", c.StartupTaint.Key)},
		{Name: "oldSpec", Expression: "has(oldObject.spec) ? oldObject.spec : {}"},
		{Name: "newSpec", Expression: "has(object.spec) ? object.spec : {}"},
		{Name: "oldTaints", Expression: "has(oldObject.spec.taints) ? oldObject.spec.taints : []"},
		{Name: "newTaints", Expression: "has(object.spec.taints) ? object.spec.taints : []"},
	}
}

func (c Config) startupTaintValidations() []admissionv1.Validation {
	if c.StartupTaint == nil {
		return nil
	}
	return []admissionv1.Validation{{
		Expression: "variables.newTaints.all(t, t in variables.oldTaints) && variables.oldTaints.all(t, t.key == variables.taintKey || t in variables.newTaints) && size(variables.newTaints) <= size(variables.oldTaints)",
		Message:    "the image prefetcher may only remove taints with the key " + c.StartupTaint.Key + " from its node; it may not add or change a taint",
	}}
}
