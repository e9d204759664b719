package render

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// The checks in this file are the kube-apiserver's own (v1.36,
// k8s.io/kubernetes/pkg/apis/core/validation) for the parts of the pod
// template a user value reaches: that package is not a library, so the
// rules are restated here, with the apiserver's reasons in plain words,
// and tests/conformance holds them against a real apiserver's verdict.
// Label names, values and selectors come from k8s.io/apimachinery.

// problemsOf turns apimachinery field errors into framework.Results at the same
// paths, in words a reader of the ImagePrefetcher understands.
func problemsOf(errs field.ErrorList) framework.Results {
	var p framework.Results
	for _, e := range errs {
		p = append(p, errorf(e.Field, "%s", plainError(e)))
	}
	return p
}

func plainError(e *field.Error) string {
	bad := func() string {
		if s, ok := e.BadValue.(string); ok {
			return fmt.Sprintf("%q", s)
		}
		return fmt.Sprintf("%v", e.BadValue)
	}
	switch e.Type {
	case field.ErrorTypeRequired:
		if e.Detail == "" {
			return "is required"
		}
		return "is required: " + e.Detail
	case field.ErrorTypeForbidden:
		return e.Detail
	case field.ErrorTypeNotSupported:
		return fmt.Sprintf("%s is not supported: %s", bad(), e.Detail)
	case field.ErrorTypeInvalid:
		return fmt.Sprintf("%s is not valid: %s", bad(), e.Detail)
	}
	return e.ErrorBody()
}

// checkLabelMap checks labels that are copied onto objects, each at its key.
func checkLabelMap(labels map[string]string, path string) framework.Results {
	var p framework.Results
	for _, k := range sortedKeys(labels) {
		fp := path + "." + k
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			p = append(p, errorf(fp, "%q is not a valid label key: %s", k, strings.Join(errs, "; ")))
		}
		if errs := validation.IsValidLabelValue(labels[k]); len(errs) > 0 {
			p = append(p, errorf(fp, "%q is not a valid label value: %s", labels[k], strings.Join(errs, "; ")))
		}
	}
	return p
}

// checkAnnotationMap checks annotations that are copied onto objects, each
// at its key, and their total size (apimachinery's ValidateAnnotations).
func checkAnnotationMap(annotations map[string]string, path string) framework.Results {
	var p framework.Results
	for _, k := range sortedKeys(annotations) {
		if errs := validation.IsQualifiedName(strings.ToLower(k)); len(errs) > 0 {
			p = append(p, errorf(path+"."+k, "%q is not a valid annotation key: %s", k, strings.Join(errs, "; ")))
		}
	}
	if err := apivalidation.ValidateAnnotationsSize(annotations); err != nil {
		p = append(p, errorf(path, "the annotations copied onto every object are too large: %v", err))
	}
	return p
}

// CheckRenderedAnnotations holds the annotations of every rendered object,
// and of a pod template, against the apiserver's limit once everything the
// function adds is there: the user's annotations alone may fit and the
// rendered objects not.
func CheckRenderedAnnotations(objs []*yaml.RNode) framework.Results {
	var p framework.Results
	for _, o := range objs {
		at := o.GetKind() + " " + o.GetName()
		err := apivalidation.ValidateAnnotationsSize(o.GetAnnotations())
		if tpl, _ := o.Pipe(yaml.Lookup("spec", "template")); err == nil && tpl != nil {
			at, err = at+"'s pod template", apivalidation.ValidateAnnotationsSize(tpl.GetAnnotations())
		}
		if err != nil {
			p = append(p, errorf("metadata.annotations", "the apiserver would refuse the rendered %s: with the function's own annotations, %v; shorten the annotations", at, err))
		}
	}
	return p
}

// checkTolerations is the apiserver's ValidateTolerations.
func checkTolerations(ts []corev1.Toleration, path string) framework.Results {
	var p framework.Results
	for i, t := range ts {
		fp := fmt.Sprintf("%s[%d]", path, i)
		if t.Key != "" {
			if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
				p = append(p, errorf(fp+".key", "%q is not a valid taint key: %s", t.Key, strings.Join(errs, "; ")))
			}
		}
		if t.Key == "" && t.Operator != corev1.TolerationOpExists {
			p = append(p, errorf(fp+".operator", "must be Exists when key is empty: a toleration without a key matches every taint, whatever its value"))
		}
		if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
			p = append(p, errorf(fp+".effect", "must be NoExecute when tolerationSeconds is set: only NoExecute taints evict, after tolerationSeconds"))
		}
		switch t.Operator {
		case "", corev1.TolerationOpEqual:
			if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
				p = append(p, errorf(fp+".value", "%q is not a valid taint value: %s", t.Value, strings.Join(errs, "; ")))
			}
		case corev1.TolerationOpExists:
			if t.Value != "" {
				p = append(p, errorf(fp+".value", "must be empty when operator is Exists"))
			}
		case corev1.TolerationOpLt, corev1.TolerationOpGt:
			// Behind the alpha feature gate TaintTolerationComparisonOperators
			// (off by default in v1.36): most clusters reject them.
			p = append(p, errorf(fp+".operator", "%q is not supported: use Equal or Exists (Lt and Gt need the alpha feature gate TaintTolerationComparisonOperators)", t.Operator))
		default:
			p = append(p, errorf(fp+".operator", "%q is not supported: use Equal or Exists", t.Operator))
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			p = append(p, errorf(fp+".effect", "%q is not supported: use NoSchedule, PreferNoSchedule or NoExecute", t.Effect))
		}
	}
	return p
}

// checkAffinity is the apiserver's validateAffinity for a new object.
func checkAffinity(a *corev1.Affinity, path string) framework.Results {
	if a == nil {
		return nil
	}
	root := field.NewPath(path)
	var errs field.ErrorList
	if na := a.NodeAffinity; na != nil {
		fp := root.Child("nodeAffinity")
		if req := na.RequiredDuringSchedulingIgnoredDuringExecution; req != nil {
			tp := fp.Child("requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
			if len(req.NodeSelectorTerms) == 0 {
				errs = append(errs, field.Required(tp, "must have at least one node selector term; to select every node, leave requiredDuringSchedulingIgnoredDuringExecution out"))
			}
			for i, term := range req.NodeSelectorTerms {
				errs = append(errs, nodeSelectorTerm(term, false, tp.Index(i))...)
			}
		}
		for i, term := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			tp := fp.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i)
			if term.Weight < 1 || term.Weight > 100 {
				errs = append(errs, field.Invalid(tp.Child("weight"), term.Weight, "must be between 1 and 100"))
			}
			// The apiserver accepts invalid label values in preferred terms.
			errs = append(errs, nodeSelectorTerm(term.Preference, true, tp.Child("preference"))...)
		}
	}
	podTerms := func(fp *field.Path, required []corev1.PodAffinityTerm, preferred []corev1.WeightedPodAffinityTerm) {
		for i, t := range required {
			errs = append(errs, podAffinityTerm(t, fp.Child("requiredDuringSchedulingIgnoredDuringExecution").Index(i))...)
		}
		for i, t := range preferred {
			tp := fp.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i)
			if t.Weight < 1 || t.Weight > 100 {
				errs = append(errs, field.Invalid(tp.Child("weight"), t.Weight, "must be between 1 and 100"))
			}
			errs = append(errs, podAffinityTerm(t.PodAffinityTerm, tp.Child("podAffinityTerm"))...)
		}
	}
	if pa := a.PodAffinity; pa != nil {
		podTerms(root.Child("podAffinity"), pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution)
	}
	if pa := a.PodAntiAffinity; pa != nil {
		podTerms(root.Child("podAntiAffinity"), pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution)
	}
	return problemsOf(errs)
}

func nodeSelectorTerm(term corev1.NodeSelectorTerm, anyValue bool, fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, rq := range term.MatchExpressions {
		rp := fp.Child("matchExpressions").Index(i)
		switch rq.Operator {
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn:
			if len(rq.Values) == 0 {
				errs = append(errs, field.Required(rp.Child("values"), "must be set when operator is In or NotIn"))
			}
		case corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist:
			if len(rq.Values) > 0 {
				errs = append(errs, field.Forbidden(rp.Child("values"), "must be empty when operator is Exists or DoesNotExist"))
			}
		case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
			if len(rq.Values) != 1 {
				errs = append(errs, field.Required(rp.Child("values"), "must hold exactly one value when operator is Gt or Lt"))
			}
		default:
			errs = append(errs, field.NotSupported(rp.Child("operator"), rq.Operator, []string{"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}))
		}
		errs = append(errs, metavalidation.ValidateLabelName(rq.Key, rp.Child("key"))...)
		if !anyValue {
			for j, v := range rq.Values {
				for _, msg := range validation.IsValidLabelValue(v) {
					errs = append(errs, field.Invalid(rp.Child("values").Index(j), v, msg))
				}
			}
		}
	}
	for i, rq := range term.MatchFields {
		rp := fp.Child("matchFields").Index(i)
		switch rq.Operator {
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn:
			if len(rq.Values) != 1 {
				errs = append(errs, field.Required(rp.Child("values"), "must hold exactly one value when operator is In or NotIn for a node field"))
			}
		default:
			errs = append(errs, field.NotSupported(rp.Child("operator"), rq.Operator, []string{"In", "NotIn"}))
		}
		if rq.Key != metav1.ObjectNameField {
			errs = append(errs, field.NotSupported(rp.Child("key"), rq.Key, []string{metav1.ObjectNameField}))
			continue
		}
		for j, v := range rq.Values {
			for _, msg := range validation.IsDNS1123Subdomain(v) {
				errs = append(errs, field.Invalid(rp.Child("values").Index(j), v, "not a node name: "+msg))
			}
		}
	}
	return errs
}

func podAffinityTerm(t corev1.PodAffinityTerm, fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	opts := metavalidation.LabelSelectorValidationOptions{}
	errs = append(errs, metavalidation.ValidateLabelSelector(t.LabelSelector, opts, fp.Child("labelSelector"))...)
	errs = append(errs, metavalidation.ValidateLabelSelector(t.NamespaceSelector, opts, fp.Child("namespaceSelector"))...)
	for i, ns := range t.Namespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(fp.Child("namespaces").Index(i), ns, "not a namespace name: "+msg))
		}
	}
	labelKeys := func(kp *field.Path, keys []string) {
		if len(keys) == 0 {
			return
		}
		if t.LabelSelector == nil {
			errs = append(errs, field.Forbidden(kp, "must be empty when labelSelector is not set"))
			return
		}
		for i, k := range keys {
			errs = append(errs, metavalidation.ValidateLabelName(k, kp.Index(i))...)
		}
	}
	labelKeys(fp.Child("matchLabelKeys"), t.MatchLabelKeys)
	labelKeys(fp.Child("mismatchLabelKeys"), t.MismatchLabelKeys)
	if t.LabelSelector != nil {
		// A key of matchLabelKeys that the selector also names, in
		// matchLabels and in a matchExpression, is refused.
		inMatchKeys := map[string]int{}
		for i, k := range t.MatchLabelKeys {
			inMatchKeys[k] = i
		}
		selectorKeys := map[string]bool{}
		for k := range t.LabelSelector.MatchLabels {
			selectorKeys[k] = true
		}
		for _, e := range t.LabelSelector.MatchExpressions {
			if i, ok := inMatchKeys[e.Key]; ok && selectorKeys[e.Key] {
				errs = append(errs, field.Invalid(fp.Child("matchLabelKeys").Index(i), e.Key, "is in both matchLabelKeys and labelSelector"))
			}
			selectorKeys[e.Key] = true
		}
	}
	mismatch := map[string]bool{}
	for _, k := range t.MismatchLabelKeys {
		mismatch[k] = true
	}
	for i, k := range t.MatchLabelKeys {
		if mismatch[k] {
			errs = append(errs, field.Invalid(fp.Child("matchLabelKeys").Index(i), k, "is in both matchLabelKeys and mismatchLabelKeys"))
		}
	}
	if t.TopologyKey == "" {
		errs = append(errs, field.Required(fp.Child("topologyKey"), "names the node label that groups nodes, such as kubernetes.io/hostname"))
	} else {
		errs = append(errs, metavalidation.ValidateLabelName(t.TopologyKey, fp.Child("topologyKey"))...)
	}
	return errs
}

// checkResources is the apiserver's validateResourceRequirements for a
// container of a pod without resource claims.
func checkResources(r corev1.ResourceRequirements, path string) framework.Results {
	var p framework.Results
	cpuOrMemory, hugePages := false, false
	check := func(kind string, list corev1.ResourceList) {
		for _, name := range sortedKeys(list) {
			q := list[name]
			fp := path + "." + kind + "." + string(name)
			if msg := containerResourceName(name); msg != "" {
				p = append(p, errorf(fp, "%q %s", name, msg))
				continue
			}
			if q.Sign() < 0 {
				p = append(p, errorf(fp, "%s is negative: a quantity must be 0 or more", q.String()))
			}
			if isExtendedResource(name) && q.MilliValue()%1000 != 0 {
				p = append(p, errorf(fp, "%s is not a whole number: extended resources are counted in units", q.String()))
			}
			if isHugePages(name) {
				hugePages = true
				page, err := resource.ParseQuantity(strings.TrimPrefix(string(name), corev1.ResourceHugePagesPrefix))
				if err != nil || page.Sign() <= 0 || page.MilliValue()%1000 != 0 || q.Value()%page.Value() != 0 {
					p = append(p, errorf(fp, "%s is not a whole multiple of the page size of %s", q.String(), name))
				}
			}
			if name == corev1.ResourceCPU || name == corev1.ResourceMemory {
				cpuOrMemory = true
			}
		}
	}
	check("limits", r.Limits)
	check("requests", r.Requests)
	for _, name := range sortedKeys(r.Requests) {
		req := r.Requests[name]
		fp := path + ".requests." + string(name)
		limit, hasLimit := r.Limits[name]
		overcommit := isNative(name) && !isHugePages(name)
		switch {
		case hasLimit && !overcommit && req.Cmp(limit) != 0:
			p = append(p, errorf(fp, "request %s must equal the limit %s: %s cannot be overcommitted", req.String(), limit.String(), name))
		case hasLimit && req.Cmp(limit) > 0:
			p = append(p, errorf(fp, "request %s is above the limit %s", req.String(), limit.String()))
		case !hasLimit && !overcommit:
			p = append(p, errorf(path+".limits."+string(name), "is required: %s cannot be overcommitted, so its limit must be set, equal to the request", name))
		}
	}
	if hugePages && !cpuOrMemory {
		p = append(p, errorf(path, "hugepages need a cpu or memory request or limit as well"))
	}
	for i := range r.Claims {
		p = append(p, errorf(fmt.Sprintf("%s.claims[%d]", path, i), "is not supported: the agent's pod has no resource claims to refer to"))
	}
	return p
}

// containerResourceName returns why name cannot be requested by a
// container, or "".
func containerResourceName(name corev1.ResourceName) string {
	if errs := validation.IsQualifiedName(string(name)); len(errs) > 0 {
		return "is not a valid resource name: " + strings.Join(errs, "; ")
	}
	if !strings.Contains(string(name), "/") {
		switch name {
		case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
			return ""
		}
		if isHugePages(name) {
			return ""
		}
		return "is not a resource a container can request: use cpu, memory, ephemeral-storage, hugepages-<size>, or an extended resource with a domain such as nvidia.com/gpu"
	}
	if !isNative(name) && !isExtendedResource(name) {
		return "is not a valid extended resource name: it must be a qualified name of at most 63 characters after the domain, such as example.com/device"
	}
	return ""
}

func isHugePages(name corev1.ResourceName) bool {
	return strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix)
}

// isNative: unprefixed names and the kubernetes.io domains belong to
// Kubernetes.
func isNative(name corev1.ResourceName) bool {
	return !strings.Contains(string(name), "/") || strings.Contains(string(name), corev1.ResourceDefaultNamespacePrefix)
}

func isExtendedResource(name corev1.ResourceName) bool {
	if isNative(name) || strings.HasPrefix(string(name), corev1.DefaultResourceRequestsPrefix) {
		return false
	}
	return len(validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix+string(name))) == 0
}
