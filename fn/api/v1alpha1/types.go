package v1alpha1

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ImagePrefetcher is the user's intent: which images every selected node
// should hold, and how hard to try. The function expands it into a
// ServiceAccount, RBAC, a ConfigMap, a DaemonSet and an admission policy.
//
// Optional scalars are pointers so that "unset" (take the default) can be
// told apart from an explicit zero or false.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
type ImagePrefetcher struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       Spec              `json:"spec"`
}

// Spec is the body of an ImagePrefetcher. docs/api.md is the field reference.
type Spec struct {
	Images             []string            `json:"images,omitempty"`
	ImageListFrom      *ImageListSource    `json:"imageListFrom,omitempty"`
	Flavor             Flavor              `json:"flavor,omitempty"`
	Runtime            Runtime             `json:"runtime,omitempty"`
	CRISocket          string              `json:"criSocket,omitempty"`
	Agent              Agent               `json:"agent,omitempty"`
	ImagePullSecrets   []string            `json:"imagePullSecrets,omitempty"`
	CredentialProvider *CredentialProvider `json:"credentialProvider,omitempty"`
	NodeSelector       map[string]string   `json:"nodeSelector,omitempty"`
	Affinity           *corev1.Affinity    `json:"affinity,omitempty"`
	// Tolerations: nil means "tolerate every taint"; an explicit empty list
	// means "tolerate none".
	Tolerations       []corev1.Toleration `json:"tolerations,omitempty"`
	PriorityClassName string              `json:"priorityClassName,omitempty"`
	Pull              Pull                `json:"pull,omitempty"`
	Rollout           Rollout             `json:"rollout,omitempty"`
	NodeLabel         NodeLabel           `json:"nodeLabel,omitempty"`
	// RefreshInterval is a Go duration; "0" disables the periodic check.
	RefreshInterval string  `json:"refreshInterval,omitempty"`
	AdmissionPolicy *bool   `json:"admissionPolicy,omitempty"`
	Metrics         Metrics `json:"metrics,omitempty"`
	// StartupTaint names a taint new nodes register with; the agent removes
	// it from its node once every image is present. See docs/readiness.md.
	StartupTaint *StartupTaint `json:"startupTaint,omitempty"`
	// Pin keeps the listed images from the kubelet's image garbage
	// collection, within a budget (containerd only; docs/agent.md).
	Pin Pin `json:"pin,omitempty"`
	// Disk keeps prefetching from filling the node's image filesystem.
	Disk Disk `json:"disk,omitempty"`
}

// Pin configures pinning: after an image of the list is present, the agent
// pins it in containerd, in list order, while the pinned images take at
// most Budget of the node's image filesystem.
type Pin struct {
	// Enabled defaults to true.
	Enabled *bool `json:"enabled,omitempty"`
	// Budget is a share of the image filesystem's capacity ("25%") or a
	// quantity of bytes ("20Gi"). Default DefaultPinBudget.
	Budget string `json:"budget,omitempty"`
}

// DefaultPinBudget is spec.pin.budget when unset: with the kubelet's
// default image GC thresholds (85% high, 80% low), a quarter pinned leaves
// more than half of the filesystem for images the GC may remove.
const DefaultPinBudget = "25%"

// Disk keeps prefetching below the kubelet's image garbage collection and
// eviction thresholds. docs/agent.md, "The disk ceiling", tells how.
type Disk struct {
	// CeilingPercent: no pull starts once the runtime's image filesystem
	// is this full (in percent, as the kubelet counts it), and pulls in
	// flight stop before it gets there. 1 to 100.
	CeilingPercent *int32 `json:"ceilingPercent,omitempty"`
	// ImageFilesystem is the host directory where the runtime keeps its
	// images (the mountpoint its ImageFsInfo reports), or a directory
	// above it; when set, it is mounted read-only, at the same path, and
	// statfs of it is the first source of the figures. Unset (the
	// default), nothing is mounted: the agent's own root filesystem, which
	// the runtime keeps there, tells them.
	ImageFilesystem string `json:"imageFilesystem,omitempty"`
	// KubeletStats lets the agent read the figures from its node's
	// kubelet (GET /stats/summary), the last source after the mount and
	// its own root filesystem. Default true. false drops the cluster-wide
	// get nodes/stats grant (docs/security.md says what it exposes).
	KubeletStats *bool `json:"kubeletStats,omitempty"`
}

// DefaultDiskCeilingPercent is spec.disk.ceilingPercent when unset: the
// kubelet's default imageGCLowThresholdPercent. Prefetching then never
// pushes a node into image GC (from 85%) or eviction (imagefs.available
// below 15%) on its own, and a pull that goes past the ceiling before it
// is stopped has 5 points of room.
const DefaultDiskCeilingPercent int32 = 80

// Metrics switches on the agent's Prometheus endpoint and the monitoring
// objects that go with it. docs/monitoring.md describes the metrics and the
// alerts.
type Metrics struct {
	Enabled *bool  `json:"enabled,omitempty"`
	Port    *int32 `json:"port,omitempty"`
	// PodMonitor renders a monitoring.coreos.com/v1 PodMonitor.
	PodMonitor *bool `json:"podMonitor,omitempty"`
	// Rules renders a monitoring.coreos.com/v1 PrometheusRule with the
	// alerts.
	Rules *bool `json:"rules,omitempty"`
}

// StartupTaint is a taint that keeps workloads off a new node until its
// images are there: Karpenter's startupTaints, the cluster-autoscaler's
// startup-taint.cluster-autoscaler.kubernetes.io/ prefix, or the kubelet's
// --register-with-taints all expect some other system to remove it.
type StartupTaint struct {
	// Key is the taint key; every taint with this key (any value, any
	// effect) is removed.
	Key string `json:"key"`
	// MaxWait is a Go duration, counted from when the agent's pod first
	// started on the node: past it the taint is removed even though images
	// are missing (fail-open). "0" keeps the taint until every image is
	// present.
	MaxWait string `json:"maxWait,omitempty"`
}

// DefaultStartupTaintMaxWait is spec.startupTaint.maxWait when unset.
const DefaultStartupTaintMaxWait = "20m"

// ImageListSource names where more images come from.
type ImageListSource struct {
	ConfigMapRef *ConfigMapKeyRef `json:"configMapRef,omitempty"`
	// Workloads selects workloads of the same ResourceList whose pod
	// templates' images join the list. An object is selected when any
	// entry matches it; an empty entry ({}) matches every workload.
	Workloads []WorkloadSelector `json:"workloads,omitempty"`
}

// WorkloadSelector has the fields and the meaning of a kustomize selector
// (patches[].target, replacements): group, version, kind, name and
// namespace are anchored regular expressions, labelSelector and
// annotationSelector are label-selector expressions. Unset fields match
// anything.
type WorkloadSelector struct {
	Group              string `json:"group,omitempty"`
	Version            string `json:"version,omitempty"`
	Kind               string `json:"kind,omitempty"`
	Name               string `json:"name,omitempty"`
	Namespace          string `json:"namespace,omitempty"`
	LabelSelector      string `json:"labelSelector,omitempty"`
	AnnotationSelector string `json:"annotationSelector,omitempty"`
}

// ConfigMapKeyRef points at one key of a ConfigMap in the same ResourceList
// and namespace.
type ConfigMapKeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// Flavor selects platform defaults.
type Flavor string

const (
	FlavorVanilla Flavor = "vanilla"
	FlavorOCP     Flavor = "ocp"
	// FlavorOpenShift is accepted as an alias of FlavorOCP.
	FlavorOpenShift Flavor = "openshift"
)

// Runtime selects the container runtime whose CRI socket the agent uses.
type Runtime string

const (
	RuntimeContainerd Runtime = "containerd"
	RuntimeCRIO       Runtime = "crio"
	// RuntimeAuto takes the runtime of the flavor: containerd for vanilla,
	// CRI-O for ocp.
	RuntimeAuto Runtime = "auto"
)

// Agent configures the agent container.
type Agent struct {
	Image     string                       `json:"image,omitempty"`
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// ImagePullSecrets are the names of the Secrets the kubelet uses to
	// pull the agent image itself (the pod's imagePullSecrets), unlike
	// Spec.ImagePullSecrets, which are for the listed images.
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
}

// CredentialProvider points at kubelet image-credential-provider plugins on
// the host.
type CredentialProvider struct {
	ConfigPath string `json:"configPath"`
	BinDir     string `json:"binDir"`
}

// Pull tunes how each node pulls. Durations are Go duration strings.
type Pull struct {
	Parallelism           *int32     `json:"parallelism,omitempty"`
	InitialAttemptTimeout string     `json:"initialAttemptTimeout,omitempty"`
	MaxAttemptTimeout     string     `json:"maxAttemptTimeout,omitempty"`
	OverallTimeout        string     `json:"overallTimeout,omitempty"`
	InitialRetryDelay     string     `json:"initialRetryDelay,omitempty"`
	MaxRetryDelay         string     `json:"maxRetryDelay,omitempty"`
	Policy                PullPolicy `json:"policy,omitempty"`
	// MaxConcurrentNodes caps how many nodes pull at the same time across
	// the cluster; 0 means no cap.
	MaxConcurrentNodes *int32 `json:"maxConcurrentNodes,omitempty"`
	// SeedNodes lets the first N nodes to get a slot pull alone, so that an
	// in-cluster mirror can serve the rest; needs MaxConcurrentNodes > 0.
	// 0 (the default) turns seeding off. See docs/herd.md.
	SeedNodes *int32 `json:"seedNodes,omitempty"`
}

// Rollout tunes how the DaemonSet rolls when the list or settings change.
type Rollout struct {
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// RequireAllImages makes a pod of the DaemonSet ready only once every
	// image of the list is on its node: the fetch init container exits with
	// an error when one failed, and the kubelet retries it with back-off.
	// A staged rollout (docs/staged-rollouts.md) then waits for the images,
	// not only for the attempt.
	RequireAllImages *bool `json:"requireAllImages,omitempty"`
}

// NodeLabel controls the per-instance node label and annotation.
type NodeLabel struct {
	Enabled *bool `json:"enabled,omitempty"`
}

// Defaults. They live here so that docs, function and tests agree.
const (
	DefaultFlavor                 = FlavorVanilla
	DefaultContainerdSocket       = "/run/containerd/containerd.sock"
	DefaultCRIOSocket             = "/var/run/crio/crio.sock"
	DefaultParallelism      int32 = 4
	DefaultInitialAttempt         = "30s"
	DefaultMaxAttempt             = "5m"
	DefaultOverallTimeout         = "20m"
	DefaultInitialRetry           = "1s"
	DefaultMaxRetry               = "10m"
	DefaultPullPolicy             = PullKubelet
	DefaultMaxUnavailable         = "10%"
	DefaultRefreshInterval        = "10m"
	DefaultMetricsPort      int32 = 9100

	// ImageListKey is the key of the rendered ConfigMap and the file name
	// the agent reads.
	ImageListKey = "images.txt"
	// ImageListDir is where the rendered ConfigMap is mounted.
	ImageListDir = "/etc/image-prefetcher"
	// ImageListVolume is the pod volume of the rendered ConfigMap, by
	// which `status --hits` finds the ConfigMap's name in the DaemonSet.
	ImageListVolume = "image-list"
	// PullSecretsDir holds one directory per pull secret.
	PullSecretsDir = "/var/run/secrets/image-prefetcher/pull-secrets"
)

// NodeKey is the node label and annotation key of an instance.
func NodeKey(instance string) string { return LabelDomain + "/" + instance }

// LeaseName is the name of the i-th concurrency slot Lease of an instance.
func LeaseName(instance string, i int) string {
	return instance + "-slot-" + strconv.Itoa(i)
}
