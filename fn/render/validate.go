package render

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
)

// Limits that keep the rendered objects reasonable.
const (
	maxParallelism        = 64
	maxConcurrentNodesCap = 1000
)

// ConfigMapLookup finds a ConfigMap of the ResourceList by namespace and
// name. It returns the ConfigMap's data and whether it was found.
type ConfigMapLookup func(namespace, name string) (data map[string]string, found bool)

// Config is an ImagePrefetcher with every default applied and every value
// checked: what the renderer needs and nothing else. Its JSON form is what
// the pod-template hash covers, so it must hold only normalized values.
type Config struct {
	Name               string           `json:"name"`
	Namespace          string           `json:"namespace"`
	Images             []string         `json:"images"`
	Flavor             v1alpha1.Flavor  `json:"flavor"`
	Runtime            v1alpha1.Runtime `json:"runtime"`
	CRISocket          string           `json:"criSocket"`
	DiskCeilingPercent int32            `json:"diskCeilingPercent"`
	ImageFilesystem    string           `json:"imageFilesystem"`
	// NoKubeletStats: spec.disk.kubeletStats false (omitted when false,
	// so that the default leaves the config hash as it was).
	NoKubeletStats     bool                         `json:"noKubeletStats,omitempty"`
	AgentImage         string                       `json:"agentImage"`
	Resources          corev1.ResourceRequirements  `json:"resources"`
	PullSecrets        []string                     `json:"pullSecrets,omitempty"`
	CredentialProvider *v1alpha1.CredentialProvider `json:"credentialProvider,omitempty"`
	NodeSelector       map[string]string            `json:"nodeSelector,omitempty"`
	Affinity           *corev1.Affinity             `json:"affinity,omitempty"`
	Tolerations        []corev1.Toleration          `json:"tolerations"`
	PriorityClassName  string                       `json:"priorityClassName,omitempty"`
	Parallelism        int32                        `json:"parallelism"`
	InitialAttempt     time.Duration                `json:"initialAttemptTimeout"`
	MaxAttempt         time.Duration                `json:"maxAttemptTimeout"`
	OverallTimeout     time.Duration                `json:"overallTimeout"`
	InitialRetry       time.Duration                `json:"initialRetryDelay"`
	MaxRetry           time.Duration                `json:"maxRetryDelay"`
	Policy             v1alpha1.PullPolicy          `json:"policy"`
	MaxConcurrentNodes int32                        `json:"maxConcurrentNodes"`
	SeedNodes          int32                        `json:"seedNodes,omitempty"`
	MaxUnavailable     intstr.IntOrString           `json:"maxUnavailable"`
	RequireAllImages   bool                         `json:"requireAllImages,omitempty"`
	NodeLabel          bool                         `json:"nodeLabel"`
	RefreshInterval    time.Duration                `json:"refreshInterval"`
	AdmissionPolicy    bool                         `json:"admissionPolicy"`
	// ExtraLabels are the ImagePrefetcher's own labels, put on every
	// rendered object: kustomize's labels/commonLabels reach the
	// ImagePrefetcher before the function runs, and so reach its output.
	ExtraLabels map[string]string `json:"extraLabels,omitempty"`
	// ExtraAnnotations are the ImagePrefetcher's own annotations, less the
	// tools' bookkeeping (see userAnnotation): kustomize's
	// commonAnnotations and an overlay's patches reach the output this way.
	ExtraAnnotations map[string]string `json:"extraAnnotations,omitempty"`
	// AgentPullSecrets are the pod's imagePullSecrets, for the agent image.
	AgentPullSecrets []string `json:"agentPullSecrets,omitempty"`
	// Metrics is nil unless spec.metrics.enabled.
	Metrics *MetricsConfig `json:"metrics,omitempty"`
	// StartupTaint is nil unless spec.startupTaint is set.
	StartupTaint *StartupTaintConfig `json:"startupTaint,omitempty"`
	// PinOff turns pinning off; PinBudget is spec.pin.budget unless it is
	// the default.
	PinOff    bool   `json:"pinOff,omitempty"`
	PinBudget string `json:"pinBudget,omitempty"`

	// sections say where the images came from, as comments of the
	// rendered list; nil when spec.images is the only source. Comments do
	// not reach the agent, so they stay out of the hash.
	sections []section
	// startupTaintKeys are Sources.StartupTaintKeys.
	startupTaintKeys []string
}

// DefaultResources are the agent's requests and limits when
// spec.agent.resources is unset: the agent only talks gRPC to the runtime,
// which does the pulling, so it needs little.
func DefaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("10m"),
			corev1.ResourceMemory: resource.MustParse("32Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("128Mi"),
		},
	}
}

// Validate checks every field, applies defaults and resolves the image
// list. The Config is meaningful only when the framework.Results hold no error.
func Validate(ip *v1alpha1.ImagePrefetcher, lookup ConfigMapLookup) (Config, framework.Results) {
	return ValidateSources(ip, Sources{ConfigMaps: lookup})
}

// ValidateSources is Validate with every source of images the ResourceList
// offers.
func ValidateSources(ip *v1alpha1.ImagePrefetcher, src Sources) (Config, framework.Results) {
	var p framework.Results
	s := ip.Spec
	c := Config{Name: ip.Metadata.Name, Namespace: ip.Metadata.Namespace, startupTaintKeys: src.StartupTaintKeys}

	switch {
	case c.Name == "":
		p = append(p, errorf("metadata.name", "is required: it names the instance"))
	case len(c.Name) > validation.DNS1123LabelMaxLength:
		p = append(p, errorf("metadata.name", "%q is %d characters long, above the %d an instance name may have: it becomes the last segment of the node label key %s", c.Name, len(c.Name), validation.DNS1123LabelMaxLength, v1alpha1.NodeKey("<name>")))
	case len(validation.IsDNS1123Label(c.Name)) > 0 || len(validation.IsQualifiedName(c.Name)) > 0:
		p = append(p, errorf("metadata.name", "%q is not a valid instance name: it becomes the node label key %s, so it must be a label name segment of at most 63 characters, and it names Kubernetes objects, so only lowercase letters, digits and '-' are allowed, starting and ending with a letter or digit", c.Name, v1alpha1.NodeKey(c.Name)))
	}
	switch {
	case c.Namespace == "":
		p = append(p, errorf("metadata.namespace", "is required: the agent's DaemonSet, ServiceAccount and ConfigMap are created in it"))
	case len(validation.IsDNS1123Label(c.Namespace)) > 0:
		p = append(p, errorf("metadata.namespace", "%q is not a valid namespace name: %s", c.Namespace, strings.Join(validation.IsDNS1123Label(c.Namespace), "; ")))
	}

	p = append(p, c.resolveImages(s, src)...)

	switch s.Flavor {
	case "", v1alpha1.FlavorVanilla:
		c.Flavor = v1alpha1.FlavorVanilla
	case v1alpha1.FlavorOCP, v1alpha1.FlavorOpenShift:
		c.Flavor = v1alpha1.FlavorOCP
	default:
		p = append(p, errorf("spec.flavor", "%q is not supported: use vanilla, ocp or openshift", s.Flavor))
	}
	switch s.Runtime {
	case "", v1alpha1.RuntimeAuto:
		c.Runtime = v1alpha1.RuntimeContainerd
		if c.Flavor == v1alpha1.FlavorOCP {
			c.Runtime = v1alpha1.RuntimeCRIO
		}
	case v1alpha1.RuntimeContainerd, v1alpha1.RuntimeCRIO:
		c.Runtime = s.Runtime
	default:
		p = append(p, errorf("spec.runtime", "%q is not supported: use containerd, crio or auto", s.Runtime))
	}
	c.CRISocket = v1alpha1.DefaultContainerdSocket
	if c.Runtime == v1alpha1.RuntimeCRIO {
		c.CRISocket = v1alpha1.DefaultCRIOSocket
	}
	if s.CRISocket != "" {
		c.CRISocket = s.CRISocket
		if err := hostFilePath(s.CRISocket); err != "" {
			p = append(p, errorf("spec.criSocket", "%q %s", s.CRISocket, err))
		}
	}

	p = append(p, c.checkDisk(s.Disk)...)

	c.AgentImage = version.AgentImage()
	if s.Agent.Image != "" {
		c.AgentImage = s.Agent.Image
		if _, err := imagelist.Normalize(s.Agent.Image); err != nil {
			p = append(p, errorf("spec.agent.image", "%v", err))
		}
	}
	c.Resources = DefaultResources()
	if s.Agent.Resources != nil {
		c.Resources = *s.Agent.Resources
		p = append(p, checkResources(c.Resources, "spec.agent.resources")...)
	}

	var sp framework.Results
	c.PullSecrets, sp = secretNames("spec.imagePullSecrets", s.ImagePullSecrets)
	p = append(p, sp...)

	if cp := s.CredentialProvider; cp != nil {
		for _, f := range []struct{ path, val string }{{"configPath", cp.ConfigPath}, {"binDir", cp.BinDir}} {
			fp := "spec.credentialProvider." + f.path
			if f.val == "" {
				p = append(p, errorf(fp, "is required: the kubelet needs both the provider config and its plugin directory"))
			} else if err := hostFilePath(f.val); err != "" {
				p = append(p, errorf(fp, "%q %s", f.val, err))
			}
		}
		c.CredentialProvider = cp
	}

	for _, k := range sortedKeys(s.NodeSelector) {
		v := s.NodeSelector[k]
		fp := "spec.nodeSelector." + k
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			p = append(p, errorf(fp, "%q is not a valid label key: %s", k, strings.Join(errs, "; ")))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			p = append(p, errorf(fp, "%q is not a valid label value: %s", v, strings.Join(errs, "; ")))
		}
	}
	c.NodeSelector = s.NodeSelector
	c.Affinity = s.Affinity
	p = append(p, checkAffinity(s.Affinity, "spec.affinity")...)

	// Like the reference, tolerate every taint unless told otherwise: the
	// images are wanted on every node a workload might land on.
	c.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	if s.Tolerations != nil {
		c.Tolerations = s.Tolerations
	}
	p = append(p, checkTolerations(s.Tolerations, "spec.tolerations")...)

	if s.PriorityClassName != "" {
		if errs := validation.IsDNS1123Subdomain(s.PriorityClassName); len(errs) > 0 {
			p = append(p, errorf("spec.priorityClassName", "%q is not a valid PriorityClass name: %s", s.PriorityClassName, strings.Join(errs, "; ")))
		}
		c.PriorityClassName = s.PriorityClassName
	}

	c.Parallelism = v1alpha1.DefaultParallelism
	if s.Pull.Parallelism != nil {
		c.Parallelism = *s.Pull.Parallelism
		if c.Parallelism < 1 || c.Parallelism > maxParallelism {
			p = append(p, errorf("spec.pull.parallelism", "must be between 1 and %d, got %d", maxParallelism, c.Parallelism))
		}
	}
	dur := func(field, val, def string, zeroOK bool, out *time.Duration) {
		if val == "" {
			val = def
		}
		d, err := time.ParseDuration(val)
		switch {
		case err != nil:
			p = append(p, errorf(field, "%q is not a duration: use a Go duration such as 90s, 5m or 1h30m", val))
		case d < 0 || (d == 0 && !zeroOK):
			if zeroOK {
				p = append(p, errorf(field, "must not be negative, got %q", val))
			} else {
				p = append(p, errorf(field, "must be greater than zero, got %q", val))
			}
		case d > 0:
			if f := durationFloors[field]; d < f.min {
				p = append(p, errorf(field, "%q is below the minimum of %s: %s", val, shortDuration(f.min), f.why))
			}
		}
		*out = d
	}
	dur("spec.pull.initialAttemptTimeout", s.Pull.InitialAttemptTimeout, v1alpha1.DefaultInitialAttempt, false, &c.InitialAttempt)
	dur("spec.pull.maxAttemptTimeout", s.Pull.MaxAttemptTimeout, v1alpha1.DefaultMaxAttempt, false, &c.MaxAttempt)
	dur("spec.pull.overallTimeout", s.Pull.OverallTimeout, v1alpha1.DefaultOverallTimeout, false, &c.OverallTimeout)
	dur("spec.pull.initialRetryDelay", s.Pull.InitialRetryDelay, v1alpha1.DefaultInitialRetry, false, &c.InitialRetry)
	dur("spec.pull.maxRetryDelay", s.Pull.MaxRetryDelay, v1alpha1.DefaultMaxRetry, false, &c.MaxRetry)
	dur("spec.refreshInterval", s.RefreshInterval, v1alpha1.DefaultRefreshInterval, true, &c.RefreshInterval)
	p = append(p, c.checkDurationOrder(s.Pull)...)

	switch s.Pull.Policy {
	case "":
		c.Policy = v1alpha1.DefaultPullPolicy
	case v1alpha1.PullKubelet, v1alpha1.PullAlways, v1alpha1.PullIfNotPresent:
		c.Policy = s.Pull.Policy
	default:
		p = append(p, errorf("spec.pull.policy", "%q is not supported: use Kubelet, IfNotPresent or Always", s.Pull.Policy))
	}
	if s.Pull.MaxConcurrentNodes != nil {
		c.MaxConcurrentNodes = *s.Pull.MaxConcurrentNodes
		if c.MaxConcurrentNodes < 0 || c.MaxConcurrentNodes > maxConcurrentNodesCap {
			p = append(p, errorf("spec.pull.maxConcurrentNodes", "must be between 0 (no cap) and %d, got %d", maxConcurrentNodesCap, c.MaxConcurrentNodes))
		}
	}

	if s.Pull.SeedNodes != nil {
		c.SeedNodes = *s.Pull.SeedNodes
		switch {
		case c.SeedNodes < 0:
			p = append(p, errorf("spec.pull.seedNodes", "must not be negative, got %d", c.SeedNodes))
		case c.SeedNodes > 0 && c.MaxConcurrentNodes == 0:
			p = append(p, errorf("spec.pull.seedNodes", "needs spec.pull.maxConcurrentNodes > 0: seeding works through the concurrency slots"))
		case c.SeedNodes > c.MaxConcurrentNodes:
			p = append(p, errorf("spec.pull.seedNodes", "%d is above spec.pull.maxConcurrentNodes %d: seeds pull in the first slots, so there can be at most as many seeds as slots", c.SeedNodes, c.MaxConcurrentNodes))
		}
	}

	c.MaxUnavailable = intstr.FromString(v1alpha1.DefaultMaxUnavailable)
	if mu := s.Rollout.MaxUnavailable; mu != nil {
		c.MaxUnavailable = *mu
		if msg := checkMaxUnavailable(*mu); msg != "" {
			p = append(p, errorf("spec.rollout.maxUnavailable", "%s", msg))
		}
	}

	p = append(p, c.validatePlatform(ip)...)
	// They land on every rendered object and on the agent's pods.
	p = append(p, checkLabelMap(c.ExtraLabels, "metadata.labels")...)
	p = append(p, checkAnnotationMap(c.ExtraAnnotations, "metadata.annotations")...)

	c.RequireAllImages = s.Rollout.RequireAllImages != nil && *s.Rollout.RequireAllImages
	c.NodeLabel = s.NodeLabel.Enabled == nil || *s.NodeLabel.Enabled
	c.AdmissionPolicy = s.AdmissionPolicy == nil || *s.AdmissionPolicy
	if c.NodeLabel && !c.AdmissionPolicy {
		// Not an error: some clusters cannot take cluster-scoped admission
		// objects. But the grant is then far wider than the agent's need,
		// and whoever renders should see that.
		p = append(p, warnf("spec.admissionPolicy", "is false: the agent's patch on nodes is then scoped by RBAC alone, so its ServiceAccount may change any label, annotation or field of every Node; keep the policy unless your cluster cannot install ValidatingAdmissionPolicies, or set spec.nodeLabel.enabled: false if you do not need the node label"))
	}
	if c.MaxConcurrentNodes > 0 && !c.AdmissionPolicy {
		p = append(p, warnf("spec.admissionPolicy", "is false: with spec.pull.maxConcurrentNodes the agent's writes of Leases are then scoped by RBAC alone, so its ServiceAccount may write any Lease of namespace %s; keep the policy, or give the instance a namespace of its own", c.Namespace))
	}
	p = append(p, c.validateStartupTaint(s)...)
	p = append(p, c.validatePin(s)...)
	if p.ExitCode() == 0 {
		// Both need a Config that renders: they look at what it renders.
		p = append(p, c.checkMounts(s)...)
		p = append(p, c.checkListSize(s)...)
	}
	return c, p
}

func (c *Config) resolveImages(s v1alpha1.Spec, sources Sources) framework.Results {
	lookup := sources.ConfigMaps
	var p framework.Results
	var b imagelist.Builder
	// Inline references get line = index+1, so that a finding can name the
	// list index; the ConfigMap text keeps its own line numbers. One builder
	// keeps one de-duplication scope across both sources.
	for i, ref := range s.Images {
		if strings.TrimSpace(ref) == "" {
			p = append(p, errorf(fmt.Sprintf("spec.images[%d]", i), "is empty"))
			continue
		}
		b.Add(i+1, ref)
	}
	nInline, nInlineDups := len(b.List().Entries), len(b.List().Duplicates)

	cmPath := "spec.imageListFrom.configMapRef"
	var cmDesc string
	if src := s.ImageListFrom; src != nil {
		ref := src.ConfigMapRef
		switch {
		case ref == nil:
			if src.Workloads == nil {
				p = append(p, errorf(cmPath, "is required when imageListFrom is set and workloads is not"))
			}
		case ref.Name == "":
			p = append(p, errorf(cmPath+".name", "is required"))
		case ref.Key == "":
			p = append(p, errorf(cmPath+".key", "is required"))
		default:
			cmDesc = fmt.Sprintf("ConfigMap %s/%s key %q", c.Namespace, ref.Name, ref.Key)
			data, found := lookup(c.Namespace, ref.Name)
			text, hasKey := data[ref.Key]
			switch {
			case !found:
				p = append(p, errorf(cmPath+".name", "ConfigMap %s/%s is not in the ResourceList, by that name or any it had before a rename: "+
					"under kustomize it must be among the resources of the kustomization that lists the function under transformers:, "+
					"or of one below it (a generator sees no resources); under kpt, in the package", c.Namespace, ref.Name))
			case !hasKey:
				p = append(p, errorf(cmPath+".key", "ConfigMap %s/%s has no key %q (keys: %s)", c.Namespace, ref.Name, ref.Key, strings.Join(sortedKeys(data), ", ")))
			default:
				b.AddText(text)
			}
		}
	}
	nBefore, nDupsBefore := len(b.List().Entries), len(b.List().Duplicates)
	var sections []section
	if s.ImageListFrom != nil && s.ImageListFrom.Workloads != nil {
		var wp framework.Results
		sections, wp = c.addWorkloads(&b, s, sources)
		p = append(p, wp...)
	}
	list := b.List()
	inlineAt := func(line int) string { return fmt.Sprintf("spec.images[%d]", line-1) }
	for i, e := range list.Entries[:nBefore] {
		if e.Err == nil {
			continue
		}
		if i < nInline {
			p = append(p, errorf(inlineAt(e.Line), "%v", e.Err))
		} else {
			p = append(p, errorf(cmPath, "%s, line %d: %v", cmDesc, e.Line, e.Err))
		}
	}
	for i, d := range list.Duplicates[:nDupsBefore] {
		if i < nInlineDups {
			p = append(p, warnf(inlineAt(d.Line), "%q duplicates %q of %s; keeping the first", d.Ref, d.FirstRef, inlineAt(d.FirstLine)))
			continue
		}
		first := fmt.Sprintf("line %d", d.FirstLine)
		for _, e := range list.Entries[:nInline] {
			if e.Ref == d.FirstRef && e.Line == d.FirstLine {
				first = inlineAt(d.FirstLine)
				break
			}
		}
		p = append(p, warnf(cmPath, "%s, line %d: %q duplicates %q of %s; keeping the first", cmDesc, d.Line, d.Ref, d.FirstRef, first))
	}
	// The list keeps each image as the kubelet would send it to the
	// runtime for that string in a pod spec (short names stay short), so
	// that CRI-O resolves them through its aliases as for the pods;
	// duplicates were dropped by their normalized form.
	for _, e := range list.Entries {
		if e.Err == nil {
			c.Images = append(c.Images, kubeletForm(e))
		}
	}
	if s.ImageListFrom != nil {
		c.sections = listSections(list, nInline, nBefore, cmDesc, sections)
	}
	if len(list.Entries) == 0 && p.ExitCode() == 0 {
		p = append(p, errorf("spec.images", "the image list is empty: list images in spec.images, in the ConfigMap named by spec.imageListFrom.configMapRef, or select workloads with spec.imageListFrom.workloads"))
	}
	return p
}

// hostFilePath returns why p cannot be mounted from the host, or "".
func hostFilePath(p string) string {
	switch {
	case !path.IsAbs(p):
		return "must be an absolute path on the node"
	case path.Clean(p) != p:
		return "must be a clean path (no '..', '//' or trailing '/')"
	case path.Dir(p) == "/":
		return "must not be directly under '/': its directory is mounted into the pod"
	}
	return ""
}

// checkDisk applies spec.disk's defaults, which depend on the runtime.
func (c *Config) checkDisk(d v1alpha1.Disk) framework.Results {
	var p framework.Results
	c.DiskCeilingPercent = v1alpha1.DefaultDiskCeilingPercent
	c.NoKubeletStats = d.KubeletStats != nil && !*d.KubeletStats
	if d.CeilingPercent != nil {
		c.DiskCeilingPercent = *d.CeilingPercent
		if c.DiskCeilingPercent < 1 || c.DiskCeilingPercent > 100 {
			p = append(p, errorf("spec.disk.ceilingPercent", "must be between 1 and 100, got %d: it is how full, in percent, the image filesystem may get from pulling (the kubelet's image GC starts at 85%% by default)", c.DiskCeilingPercent))
		}
	}
	if f := d.ImageFilesystem; f != "" {
		c.ImageFilesystem = f
		switch {
		case !path.IsAbs(f):
			p = append(p, errorf("spec.disk.imageFilesystem", "%q must be an absolute path on the node", f))
		case path.Clean(f) != f:
			p = append(p, errorf("spec.disk.imageFilesystem", "%q must be a clean path (no '..', '//' or trailing '/')", f))
		case f == "/":
			p = append(p, errorf("spec.disk.imageFilesystem", "must not be '/': name the runtime's image directory, the mountpoint its ImageFsInfo reports (such as /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs), or its root"))
		}
	}
	return p
}

func checkMaxUnavailable(v intstr.IntOrString) string {
	if v.Type == intstr.Int {
		if v.IntVal < 1 {
			return fmt.Sprintf("must be at least 1, got %d", v.IntVal)
		}
		return ""
	}
	n, ok := strings.CutSuffix(v.StrVal, "%")
	i, err := strconv.Atoi(n)
	if !ok || err != nil || i < 1 || i > 100 {
		return fmt.Sprintf("%q must be a number of nodes (at least 1) or a percentage between 1%% and 100%%", v.StrVal)
	}
	return ""
}

func sortedKeys[M ~map[K]V, K cmp.Ordered, V any](m M) []K {
	return slices.Sorted(maps.Keys(m))
}

// kubeletForm is how the rendered list names a valid entry: as the kubelet
// sends its reference to the runtime (imagelist.KubeletRef).
func kubeletForm(e imagelist.Entry) string {
	if ref, err := imagelist.KubeletRef(e.Ref); err == nil {
		return ref
	}
	return e.Normalized
}

// secretNames checks a list of Secret names at path: each a valid name,
// none twice. It returns the valid names, first of each kept.
func secretNames(path string, names []string) ([]string, framework.Results) {
	var valid []string
	var p framework.Results
	seen := map[string]bool{}
	for i, name := range names {
		fp := fmt.Sprintf("%s[%d]", path, i)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			p = append(p, errorf(fp, "%q is not a valid Secret name: %s", name, strings.Join(errs, "; ")))
			continue
		}
		if seen[name] {
			p = append(p, errorf(fp, "Secret %q is listed twice", name))
			continue
		}
		seen[name] = true
		valid = append(valid, name)
	}
	return valid, p
}
