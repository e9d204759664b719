package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// Label keys and values put on every rendered object.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelPartOf    = "app.kubernetes.io/part-of"
	AppName        = "image-prefetcher"
	ManagedBy      = "image-prefetcher-fn"

	// ConfigHashAnnotation on the pod template holds the sha256 of the
	// normalized list and settings: any change rolls the DaemonSet, even
	// where the ConfigMap name carries no content hash.
	ConfigHashAnnotation  = v1alpha1.LabelDomain + "/config-hash"
	requiredSCCAnnotation = "openshift.io/required-scc"
)

// Names of the rendered objects of an instance.
//
// The rule that keeps them apart: every namespaced object of instance N is
// named image-prefetcher-N, or image-prefetcher-N.<suffix> for a second
// object of a kind; every cluster-scoped one image-prefetcher.<ns>.N.
// Instance names and namespaces are DNS labels, which hold no '.', so the
// text before the first '.' (namespaced) or between the dots (cluster
// scope) gives back the instance: no two instances can render the same
// name. A '-' suffix would break this: web's "-scc" Role would be the
// Role of an instance named web-scc.
type Names struct {
	// Namespaced objects: ServiceAccount, DaemonSet, Role, RoleBinding.
	Namespaced string
	// ImageList names the list ConfigMap, with a suffix of its own so
	// that no rule that names objects could confuse it with the
	// DaemonSet: kustomize rewrites every Role resourceName equal to a
	// ConfigMap's name when it renames that ConfigMap (the hash suffix of
	// generator mode), without looking at the rule's resource.
	ImageList string
	// SCCRole names the Role and RoleBinding granting "use" on the SCC.
	SCCRole string
	// Cluster-scoped objects include the namespace. Namespaces and instance
	// names cannot hold '.', so the '.' separators make the name unique per
	// (namespace, instance) pair.
	Cluster string
}

// NamesFor returns the object names of instance name in namespace ns.
func NamesFor(ns, name string) Names {
	n := Names{
		Namespaced: AppName + "-" + name,
		Cluster:    AppName + "." + ns + "." + name,
	}
	n.SCCRole = n.Namespaced + ".scc"
	n.ImageList = n.Namespaced + ".images"
	return n
}

// The agent's ClusterRole carries one more rule, on a resource that does not
// exist: verb "label" on "agents" of the API group, by the instance's
// Marker (v1alpha1.Instance: its namespace and name as rendered). Nothing
// serves that resource, so the rule grants nothing; it marks the holder.
// The admission policy recognises the agent by asking the authorizer about
// the mark instead of comparing user names: kustomize rewrites the
// ClusterRoleBinding's roleRef and subjects when a namePrefix is applied
// after the function ran, so the mark follows the ServiceAccount through
// any rename, while a user name inside a CEL string would not, and the
// policy would silently stop matching. The mark names the namespace as
// well as the name, so that the policy of one instance never matches the
// agent of another, whatever their names.
//
// The name holds a '/': no Kubernetes object can have that name, so none of
// kustomize's nameReferences into ClusterRole rules/resourceNames
// (ConfigMap, Secret, PersistentVolume and the SCC entry of
// scc-namereference.yaml) can ever rewrite it.
const (
	MarkerResource = "agents"
	MarkerVerb     = "label"
)

// instance is the identity every rendered piece derives from.
func (c Config) instance() v1alpha1.Instance {
	return v1alpha1.Instance{Namespace: c.Namespace, Name: c.Name}
}

// Labels returns the common labels of an instance's objects.
func Labels(name string) map[string]string {
	return map[string]string{
		LabelName:      AppName,
		LabelInstance:  name,
		LabelManagedBy: ManagedBy,
		LabelPartOf:    AppName,
	}
}

func selectorLabels(name string) map[string]string {
	return map[string]string{LabelName: AppName, LabelInstance: name}
}

// Hash is the sha256 of the normalized list and every setting that reaches
// the pods. A change of the hash changes the pod template, which rolls every
// pod; settings that live outside the pod template are left out, so that
// changing them does not restart the agents for nothing: the DaemonSet's
// update strategy (maxUnavailable), which the controller applies without a
// new revision, and whether the admission policy is rendered.
func (c Config) Hash() string {
	c.MaxUnavailable = intstr.IntOrString{}
	c.AdmissionPolicy = false
	if c.Metrics != nil {
		// The monitoring objects live beside the DaemonSet, not in it.
		m := *c.Metrics
		m.PodMonitor, m.Rules = false, false
		c.Metrics = &m
	}
	b, err := json.Marshal(c)
	if err != nil {
		// Config holds only plain data; failing to marshal it is a bug.
		panic(fmt.Sprintf("marshal config: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ImageListText is the content of the rendered images.txt.
func (c Config) ImageListText() string {
	if c.sections != nil {
		return sectionText(c.sections)
	}
	return strings.Join(c.Images, "\n") + "\n"
}

// Render expands a validated Config into the objects of the instance, in
// a fixed order.
func Render(c Config) ([]*yaml.RNode, error) {
	n := NamesFor(c.Namespace, c.Name)
	labels := c.objectLabels()
	meta := func(name string, namespaced bool) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Labels: labels, Annotations: c.ExtraAnnotations}
		if namespaced {
			m.Namespace = c.Namespace
		}
		return m
	}
	typ := func(apiVersion, kind string) metav1.TypeMeta {
		return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
	}
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: n.Namespaced, Namespace: c.Namespace}

	objs := []any{&corev1.ServiceAccount{TypeMeta: typ("v1", "ServiceAccount"), ObjectMeta: meta(n.Namespaced, true)}}
	// Nodes cannot be narrowed by name here (the DaemonSet's node set is
	// dynamic). get nodes finds the agent's kubelet; get nodes/stats reads
	// the image filesystem's figures from it (docs/security.md), nothing
	// else of the kubelet's, unless spec.disk.kubeletStats is false. The patch is narrowed by the admission policy
	// to the agent's own node and its own label and annotation.
	nodeRules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}
	if !c.NoKubeletStats {
		nodeRules = append(nodeRules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/stats"}, Verbs: []string{"get"}})
	}
	if c.NodeLabel {
		nodeRules[0].Verbs = []string{"get", "patch"}
	}
	if c.NodeLabel || c.MaxConcurrentNodes > 0 {
		// The mark the admission policies match; see MarkerResource.
		nodeRules = append(nodeRules, rbacv1.PolicyRule{APIGroups: []string{v1alpha1.Group}, Resources: []string{MarkerResource}, ResourceNames: []string{c.instance().Marker()}, Verbs: []string{MarkerVerb}})
	}
	objs = append(objs,
		&rbacv1.ClusterRole{
			TypeMeta:   typ("rbac.authorization.k8s.io/v1", "ClusterRole"),
			ObjectMeta: meta(n.Cluster, false),
			Rules:      nodeRules,
		},
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   typ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
			ObjectMeta: meta(n.Cluster, false),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: n.Cluster},
			Subjects:   []rbacv1.Subject{sa},
		})
	objs = append(objs,
		&rbacv1.Role{
			TypeMeta:   typ("rbac.authorization.k8s.io/v1", "Role"),
			ObjectMeta: meta(n.Namespaced, true),
			Rules:      append(c.roleRules(), ownPodAndDaemonSetRule()),
		},
		&rbacv1.RoleBinding{
			TypeMeta:   typ("rbac.authorization.k8s.io/v1", "RoleBinding"),
			ObjectMeta: meta(n.Namespaced, true),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: n.Namespaced},
			Subjects:   []rbacv1.Subject{sa},
		})
	if c.Flavor == v1alpha1.FlavorOCP {
		objs = append(objs,
			&rbacv1.Role{
				TypeMeta:   typ("rbac.authorization.k8s.io/v1", "Role"),
				ObjectMeta: meta(n.SCCRole, true),
				Rules: []rbacv1.PolicyRule{{
					APIGroups: []string{"security.openshift.io"}, Resources: []string{"securitycontextconstraints"},
					ResourceNames: []string{n.Cluster}, Verbs: []string{"use"},
				}},
			},
			&rbacv1.RoleBinding{
				TypeMeta:   typ("rbac.authorization.k8s.io/v1", "RoleBinding"),
				ObjectMeta: meta(n.SCCRole, true),
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: n.SCCRole},
				Subjects:   []rbacv1.Subject{sa},
			})
	}
	objs = append(objs,
		&corev1.ConfigMap{
			TypeMeta:   typ("v1", "ConfigMap"),
			ObjectMeta: meta(n.ImageList, true),
			// The list is set on the node below: a long string is slow to
			// push through JSON and back.
			Data: map[string]string{v1alpha1.ImageListKey: ""},
		},
		c.daemonSet(n, labels, meta(n.Namespaced, true)))
	if c.NodeLabel && c.AdmissionPolicy {
		objs = append(objs, c.admissionPolicy(meta(n.Cluster, false)), &admissionv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   typ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
			ObjectMeta: meta(n.Cluster, false),
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        n.Cluster,
				ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			},
		})
	}
	if c.AdmissionPolicy && c.MaxConcurrentNodes > 0 {
		name := n.Cluster + ".leases"
		objs = append(objs, c.leasePolicy(meta(name, false)), &admissionv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   typ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
			ObjectMeta: meta(name, false),
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        name,
				ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			},
		})
	}
	if c.Flavor == v1alpha1.FlavorOCP {
		objs = append(objs, c.scc(meta(n.Cluster, false)))
	}
	objs = append(objs, c.monitoring(meta(n.Namespaced, true))...)

	out := make([]*yaml.RNode, 0, len(objs))
	for _, o := range objs {
		node, err := toNode(o)
		if err != nil {
			return nil, fmt.Errorf("render %T: %w", o, err)
		}
		if _, isCM := o.(*corev1.ConfigMap); isCM {
			v, err := node.Pipe(yaml.Lookup("data", v1alpha1.ImageListKey))
			if err != nil || v == nil {
				return nil, fmt.Errorf("render ConfigMap: no data.%s", v1alpha1.ImageListKey)
			}
			v.YNode().Value = c.ImageListText()
			v.YNode().Style = yaml.LiteralStyle
		}
		out = append(out, node)
	}
	return out, nil
}

func (c Config) roleRules() []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{{
		APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"},
	}}
	if c.MaxConcurrentNodes > 0 {
		// The K slots, and the tickets of the queue, one per wait, whose
		// names are made at run time: RBAC can name neither, nor select by
		// label, so the Role lets the agent read and write every Lease of
		// the namespace, and the Lease policy (leasePolicy) limits its
		// writes to the slots and tickets of its instance.
		rules = append(rules,
			rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
				Verbs: []string{"create", "get", "list", "watch", "update", "delete"}},
		)
	}
	return rules
}

// ownPodAndDaemonSetRule lets the agent find its own DaemonSet: it reads
// its pod (POD_NAME) for the controller owner reference, then that
// DaemonSet. watch keeps the node key across a rollout only while the
// DaemonSet still covers the node with the same list. The grant is namespace-wide, not by name:
// a namePrefix or nameSuffix applied after the function ran, or the
// function run from a kustomize component, renames the DaemonSet after
// its name was rendered into the rule, and pod names are generated. The
// namespace is the instance's own (docs/security.md), and the rule only
// reads.
func ownPodAndDaemonSetRule() rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{"", "apps"}, Resources: []string{"pods", "daemonsets"}, Verbs: []string{"get"}}
}

// Volume names inside the pod.
const (
	volImageList = v1alpha1.ImageListVolume
	volCRISocket = "cri-socket"
	volTmp       = "tmp"
	volCPConfig  = "credential-provider-config"
	volCPBin     = "credential-provider-bin"
	volImageFS   = "image-filesystem"
)

func (c Config) flags(subcommand string) []string {
	f := []string{
		subcommand,
		"--cri-socket=" + c.CRISocket,
		fmt.Sprintf("--disk-ceiling-percent=%d", c.DiskCeilingPercent),
		"--image-list-file=" + path.Join(v1alpha1.ImageListDir, v1alpha1.ImageListKey),
	}
	if c.NoKubeletStats {
		f = append(f, "--kubelet-stats=false")
	}
	for _, s := range c.PullSecrets {
		f = append(f, "--docker-config="+path.Join(v1alpha1.PullSecretsDir, s))
	}
	if cp := c.CredentialProvider; cp != nil {
		f = append(f, "--image-credential-provider-config="+cp.ConfigPath, "--image-credential-provider-bin-dir="+cp.BinDir)
	}
	f = append(f,
		"--initial-pull-attempt-timeout="+c.InitialAttempt.String(),
		"--max-pull-attempt-timeout="+c.MaxAttempt.String(),
		"--overall-timeout="+c.OverallTimeout.String(),
		"--initial-pull-attempt-delay="+c.InitialRetry.String(),
		"--max-pull-attempt-delay="+c.MaxRetry.String(),
		fmt.Sprintf("--parallelism=%d", c.Parallelism),
		"--pull-policy="+string(c.Policy),
	)
	if !c.NodeLabel {
		f = append(f, "--label-node=false")
	}
	if c.MaxConcurrentNodes > 0 {
		f = append(f, fmt.Sprintf("--max-concurrent-nodes=%d", c.MaxConcurrentNodes))
	}
	if c.SeedNodes > 0 {
		f = append(f, fmt.Sprintf("--seed-nodes=%d", c.SeedNodes))
	}
	f = append(f, c.startupTaintFlags()...)
	f = append(f, c.pinFlags()...)
	if subcommand == "watch" {
		f = append(f, "--refresh-interval="+c.RefreshInterval.String())
	}
	if subcommand == "fetch" && c.RequireAllImages {
		f = append(f, "--fail-on-error")
	}
	return f
}

func (c Config) daemonSet(n Names, labels map[string]string, meta metav1.ObjectMeta) *appsv1.DaemonSet {
	ro := true
	socketDir := path.Dir(c.CRISocket)
	dirType, fileType, dirOrCreate := corev1.HostPathDirectory, corev1.HostPathFile, corev1.HostPathDirectoryOrCreate

	mounts := []corev1.VolumeMount{
		{Name: volImageList, MountPath: v1alpha1.ImageListDir, ReadOnly: true},
		{Name: volCRISocket, MountPath: socketDir, ReadOnly: true},
	}
	volumes := []corev1.Volume{
		{Name: volImageList, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: n.ImageList},
		}}},
		{Name: volCRISocket, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: socketDir, Type: &dirType}}},
	}
	for i, s := range c.PullSecrets {
		name := fmt.Sprintf("pull-secret-%d", i)
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: path.Join(v1alpha1.PullSecretsDir, s), ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: s}}})
	}
	if cp := c.CredentialProvider; cp != nil {
		mounts = append(mounts,
			corev1.VolumeMount{Name: volCPConfig, MountPath: cp.ConfigPath, ReadOnly: true},
			corev1.VolumeMount{Name: volCPBin, MountPath: cp.BinDir, ReadOnly: true})
		volumes = append(volumes,
			corev1.Volume{Name: volCPConfig, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: cp.ConfigPath, Type: &fileType}}},
			corev1.Volume{Name: volCPBin, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: cp.BinDir, Type: &dirType}}})
	}
	// Only when asked: the kubelet's stats give the figures by default;
	// statfs of a mounted path gives them fresher (agent/disk). At the
	// host's path, because that is the path the runtime reports.
	// DirectoryOrCreate: a node whose runtime keeps its images elsewhere
	// still starts the agent (docs/security.md).
	if c.ImageFilesystem != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: volImageFS, MountPath: c.ImageFilesystem, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: volImageFS, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: c.ImageFilesystem, Type: &dirOrCreate}}})
	}
	// The root filesystem is read-only; this is the only writable place.
	mounts = append(mounts, corev1.VolumeMount{Name: volTmp, MountPath: "/tmp"})
	volumes = append(volumes, corev1.Volume{Name: volTmp, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})

	env := []corev1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		// kubectl describe pod shows an Event only when its
		// involvedObject.uid is the pod's.
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "INSTANCE_NAME", Value: c.Name},
		// The namespace rendered for, which nothing rewrites: a namespace:
		// applied above the function moves the pod away from its policy
		// and mark, and the agent then refuses to run (docs/api.md).
		{Name: v1alpha1.EnvInstanceNamespace, Value: c.Namespace},
	}
	f, root := false, int64(0)
	sc := &corev1.SecurityContext{
		Privileged:               &f,
		AllowPrivilegeEscalation: &f,
		ReadOnlyRootFilesystem:   &ro,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		// The CRI socket is owned by root with mode 0660 (containerd) or
		// 0600 (CRI-O), and its directory is root-only. Running as UID 0
		// is the only way to connect without privileges or capabilities:
		// every capability is dropped, so root here cannot override file
		// permissions, load modules or touch other processes.
		RunAsUser:      &root,
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	container := func(name string) corev1.Container {
		ctr := corev1.Container{
			Name:            name,
			Image:           c.AgentImage,
			Args:            c.flags(name),
			Env:             env,
			Resources:       c.Resources,
			VolumeMounts:    mounts,
			SecurityContext: sc,
		}
		c.addMetrics(&ctr)
		return ctr
	}

	annotations := c.podAnnotations()
	// The agent parses the rendered list with the same rules and compares
	// digests: see v1alpha1.ListDigestAnnotation.
	annotations[v1alpha1.ListDigestAnnotation] = imagelist.Parse(c.ImageListText()).Digest()
	podSC := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if c.Flavor == v1alpha1.FlavorOCP {
		annotations[requiredSCCAnnotation] = n.Cluster
		// spc_t lets a confined container reach the runtime socket, whose
		// SELinux label container_t may not connect to.
		podSC.SELinuxOptions = sccSELinux()
	}
	mu := c.MaxUnavailable
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: meta,
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(c.Name)},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type:          appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &mu},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
				Spec: corev1.PodSpec{
					ServiceAccountName: n.Namespaced,
					ImagePullSecrets:   c.podPullSecrets(),
					NodeSelector:       c.NodeSelector,
					Affinity:           c.Affinity,
					Tolerations:        c.Tolerations,
					PriorityClassName:  c.PriorityClassName,
					SecurityContext:    podSC,
					InitContainers:     []corev1.Container{container("fetch")},
					Containers:         []corev1.Container{container("watch")},
					Volumes:            volumes,
				},
			},
		},
	}
}

// admissionPolicy limits what the agent's ServiceAccount may do to a Node:
// RBAC can only grant "patch nodes", so the policy makes sure the patch
// touches this instance's label and annotation on the agent's own node and
// nothing else, apart from removing the instance's startup taint when it
// has one (taint.go).
//
// It matches the agent by the marker rule of its ClusterRole (see
// MarkerResource), not by user name, so that it keeps matching when
// kustomize renames the ServiceAccount after the function ran: the policy
// fails closed under renames.
func (c Config) admissionPolicy(meta metav1.ObjectMeta) *admissionv1.ValidatingAdmissionPolicy {
	fail := admissionv1.Fail
	key := v1alpha1.NodeKey(c.Name)
	keep := func(field string) string {
		return fmt.Sprintf("has(object.metadata.%[1]s) == has(oldObject.metadata.%[1]s) && (!has(object.metadata.%[1]s) || object.metadata.%[1]s == oldObject.metadata.%[1]s)", field)
	}
	onlyKey := func(v string) string {
		return fmt.Sprintf("variables.new%[1]s.all(k, k == variables.key || (k in variables.old%[1]s && variables.old%[1]s[k] == variables.new%[1]s[k])) && variables.old%[1]s.all(k, k == variables.key || k in variables.new%[1]s)", v)
	}
	p := &admissionv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta,
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionv1.RuleWithOperations{
						Operations: []admissionv1.OperationType{admissionv1.Update},
						Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
					},
				}},
			},
			MatchConditions: c.agentConditions(),
			Variables: []admissionv1.Variable{
				{Name: "key", Expression: fmt.Sprintf("'%s'", key)},
				{Name: "oldLabels", Expression: "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"},
				{Name: "newLabels", Expression: "has(object.metadata.labels) ? object.metadata.labels : {}"},
				{Name: "oldAnnotations", Expression: "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
				{Name: "newAnnotations", Expression: "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
				{Name: "nodeNames", Expression: "'authentication.kubernetes.io/node-name' in request.userInfo.extra ? request.userInfo.extra['authentication.kubernetes.io/node-name'] : []"},
			},
			Validations: []admissionv1.Validation{
				{
					Expression: "variables.nodeNames.exists(n, n == object.metadata.name)",
					Message:    "the image prefetcher may only change the node its own pod runs on (authentication.kubernetes.io/node-name of a pod-bound token)",
				},
				{Expression: onlyKey("Labels"), Message: "the image prefetcher may only change the label " + key},
				{Expression: onlyKey("Annotations"), Message: "the image prefetcher may only change the annotation " + key},
				{
					Expression: fmt.Sprintf("!(variables.key in variables.newLabels) || variables.newLabels[variables.key] in ['%s', '%s']", v1alpha1.LabelSucceeded, v1alpha1.LabelFailed),
					Message:    fmt.Sprintf("the label %s must be %s or %s", key, v1alpha1.LabelSucceeded, v1alpha1.LabelFailed),
				},
				c.specValidation(),
				{Expression: keep("ownerReferences") + " && " + keep("finalizers"), Message: "the image prefetcher may not change the node's owners or finalizers"},
			},
		},
	}
	// The key's owner; see owner.go.
	p.Spec.Variables = append(p.Spec.Variables, ownerVariables(c.instance())...)
	p.Spec.Validations = append(p.Spec.Validations, ownerValidations(c.instance())...)
	p.Spec.Variables = append(p.Spec.Variables, c.startupTaintVariables()...)
	p.Spec.Validations = append(p.Spec.Validations, c.startupTaintValidations()...)
	return p
}

// agentConditions match the requests of the instance's agent: the
// policies recognise it by the ClusterRole's mark (MarkerResource).
func (c Config) agentConditions() []admissionv1.MatchCondition {
	marker := fmt.Sprintf("authorizer.group('%s').resource('%s')", v1alpha1.Group, MarkerResource)
	return []admissionv1.MatchCondition{
		{
			Name:       "is-image-prefetcher-agent",
			Expression: fmt.Sprintf("%s.name('%s').check('%s').allowed()", marker, c.instance().Marker(), MarkerVerb),
		},
		{
			// A grant that covers every name of the marker resource
			// (cluster-admin's "*" on "*", system:masters) also passes the
			// check above. Such principals are not the agent and may
			// change Nodes and Leases anyway; without this condition the
			// policies would lock them out.
			Name:       "not-a-wildcard-grant",
			Expression: fmt.Sprintf("!%s.check('%s').allowed()", marker, MarkerVerb),
		},
	}
}

// leasePolicy limits the agent's Lease writes to its instance's K slots
// and its queue's tickets (agent/slots): the Role cannot name them. It
// recognises the agent by the ClusterRole's mark, as admissionPolicy does.
func (c Config) leasePolicy(meta metav1.ObjectMeta) *admissionv1.ValidatingAdmissionPolicy {
	fail := admissionv1.Fail
	slots := make([]string, c.MaxConcurrentNodes)
	for i := range slots {
		slots[i] = "'" + v1alpha1.LeaseName(c.Name, i) + "'"
	}
	ticket := c.Name + "-wait-"
	forbidden := metav1.StatusReasonForbidden
	return &admissionv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta,
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionv1.RuleWithOperations{
						Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete},
						Rule: admissionv1.Rule{APIGroups: []string{"coordination.k8s.io"}, APIVersions: []string{"v1"},
							Resources: []string{"leases"}},
					},
				}},
			},
			MatchConditions: c.agentConditions(),
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("request.name in [%s] || (request.name.startsWith('%s') && request.name.size() == %d && request.name.substring(%d).matches('^[0-9a-f]+$'))",
					strings.Join(slots, ", "), ticket, len(ticket)+16, len(ticket)),
				Message: fmt.Sprintf("the image prefetcher may only write the Leases %s-slot-0 to %s-slot-%d and its queue's tickets %s<16 hex digits>",
					c.Name, c.Name, c.MaxConcurrentNodes-1, ticket),
				// Forbidden, as RBAC would say: the agent skips a slot it
				// may not write (K was lowered) and takes another.
				Reason: &forbidden,
			}},
		},
	}
}

// securityContextConstraints is the part of OpenShift's SCC type that the
// function sets; the whole type is not worth a dependency.
type securityContextConstraints struct {
	metav1.TypeMeta          `json:",inline"`
	Metadata                 metav1.ObjectMeta `json:"metadata"`
	AllowHostDirVolumePlugin bool              `json:"allowHostDirVolumePlugin"`
	AllowHostIPC             bool              `json:"allowHostIPC"`
	AllowHostNetwork         bool              `json:"allowHostNetwork"`
	AllowHostPID             bool              `json:"allowHostPID"`
	AllowHostPorts           bool              `json:"allowHostPorts"`
	AllowPrivilegeEscalation bool              `json:"allowPrivilegeEscalation"`
	AllowPrivilegedContainer bool              `json:"allowPrivilegedContainer"`
	ReadOnlyRootFilesystem   bool              `json:"readOnlyRootFilesystem"`
	RequiredDropCapabilities []string          `json:"requiredDropCapabilities"`
	RunAsUser                sccStrategy       `json:"runAsUser"`
	SELinuxContext           sccStrategy       `json:"seLinuxContext"`
	FSGroup                  sccStrategy       `json:"fsGroup"`
	SupplementalGroups       sccStrategy       `json:"supplementalGroups"`
	SeccompProfiles          []string          `json:"seccompProfiles"`
	Volumes                  []string          `json:"volumes"`
}

type sccStrategy struct {
	Type           string                 `json:"type"`
	UID            *int64                 `json:"uid,omitempty"`
	SELinuxOptions *corev1.SELinuxOptions `json:"seLinuxOptions,omitempty"`
}

func (c Config) scc(meta metav1.ObjectMeta) *securityContextConstraints {
	root := int64(0)
	return &securityContextConstraints{
		TypeMeta: metav1.TypeMeta{APIVersion: "security.openshift.io/v1", Kind: "SecurityContextConstraints"},
		Metadata: meta,
		// hostPath is needed for the CRI socket directory (and the
		// credential-provider paths); everything else stays forbidden.
		AllowHostDirVolumePlugin: true,
		ReadOnlyRootFilesystem:   true,
		RequiredDropCapabilities: []string{"ALL"},
		// UID 0 for the root-owned CRI socket; see the DaemonSet.
		RunAsUser:          sccStrategy{Type: "MustRunAs", UID: &root},
		SELinuxContext:     sccStrategy{Type: "MustRunAs", SELinuxOptions: sccSELinux()},
		FSGroup:            sccStrategy{Type: "RunAsAny"},
		SupplementalGroups: sccStrategy{Type: "RunAsAny"},
		SeccompProfiles:    []string{"runtime/default"},
		Volumes:            []string{"configMap", "downwardAPI", "emptyDir", "hostPath", "projected", "secret"},
	}
}

// sccSELinux is the SELinux context of the pod, and the one the SCC
// requires. A MustRunAs SCC without a level takes the level from the
// namespace (openshift.io/sa.scc.mcs) and then rejects a pod whose
// seLinuxOptions name a type but no level; a fixed level on both sides
// keeps them equal. spc_t is not confined by MCS categories anyway.
func sccSELinux() *corev1.SELinuxOptions {
	return &corev1.SELinuxOptions{Type: "spc_t", Level: "s0"}
}
