package examples_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	securityv1 "github.com/openshift/api/security/v1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// apiServer is a real etcd + kube-apiserver from tests/cluster.
type apiServer struct {
	c      *cluster.Cluster
	dyn    dynamic.Interface
	mapper meta.ResettableRESTMapper
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	c := cluster.StartForTest(t, cluster.Options{Nodes: 0})
	cfg, err := c.RESTConfig()
	if err != nil {
		t.Fatalf("rest config: %v", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatalf("discovery client: %v", err)
	}
	return &apiServer{c: c, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// decodeObjects splits a multi-document YAML stream.
func decodeObjects(t *testing.T, manifests []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decode rendered YAML: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

const sccGroup = "security.openshift.io"

// dryRunApply server-side applies every object of the rendered output with
// dryRun=All and strict field validation. Namespaces in the output are
// applied for real first, because a dry run cannot create the namespace its
// other objects need. SecurityContextConstraints, unknown to a plain
// apiserver, are strictly decoded into the OpenShift API types instead.
func (a *apiServer) dryRunApply(t *testing.T, manifests []byte) {
	t.Helper()
	objs := decodeObjects(t, manifests)
	if len(objs) == 0 {
		t.Fatal("rendered output holds no objects")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, o := range objs {
		if o.GetKind() == "Namespace" && o.GroupVersionKind().Group == "" {
			a.apply(ctx, t, o, false)
		}
	}
	for _, o := range objs {
		switch {
		case o.GetAnnotations()["config.kubernetes.io/local-config"] == "true":
			// Kept in a kpt package as its intent; kpt live apply and
			// kustomize leave it out.
		case o.GroupVersionKind().Group == sccGroup:
			strictSCC(t, o)
		case o.GroupVersionKind().Group == monitoringv1.SchemeGroupVersion.Group:
			strictMonitoring(t, o)
		case o.GetKind() == "Namespace" && o.GroupVersionKind().Group == "":
		default:
			a.apply(ctx, t, o, true)
		}
	}
}

func (a *apiServer) apply(ctx context.Context, t *testing.T, o *unstructured.Unstructured, dryRun bool) {
	t.Helper()
	gvk := o.GroupVersionKind()
	id := fmt.Sprintf("%s %s/%s", gvk.Kind, o.GetNamespace(), o.GetName())
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Errorf("%s: the apiserver does not serve this kind: %v", id, err)
		return
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			t.Errorf("%s: namespaced object without a namespace", id)
			return
		}
		ri = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	} else if o.GetNamespace() != "" {
		t.Errorf("%s: cluster-scoped object carries metadata.namespace", id)
		return
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.PatchOptions{FieldManager: "image-prefetcher-examples", Force: new(true), FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, opts); err != nil {
		if apierrors.IsNotFound(err) && dryRun {
			t.Errorf("%s: %v (is its namespace missing from the output?)", id, err)
			return
		}
		t.Errorf("%s: server-side apply (dryRun=%v): %v", id, dryRun, err)
	}
}

// strictSCC decodes a SecurityContextConstraints into the OpenShift types,
// rejecting unknown fields, and checks the properties the ocp flavor
// promises: hostPath allowed, nothing privileged, every capability dropped.
func strictSCC(t *testing.T, o *unstructured.Unstructured) *securityv1.SecurityContextConstraints {
	t.Helper()
	scc, err := decodeSCC(o)
	if err != nil {
		t.Errorf("SecurityContextConstraints %s: %v", o.GetName(), err)
		return nil
	}
	if o.GetAPIVersion() != securityv1.GroupVersion.String() {
		t.Errorf("SCC %s: apiVersion %q, want %q", scc.Name, o.GetAPIVersion(), securityv1.GroupVersion)
	}
	if o.GetNamespace() != "" {
		t.Errorf("SCC %s: cluster-scoped but has namespace %q", scc.Name, o.GetNamespace())
	}
	if scc.AllowPrivilegedContainer {
		t.Errorf("SCC %s allows privileged containers", scc.Name)
	}
	if !scc.AllowHostDirVolumePlugin {
		t.Errorf("SCC %s does not allow hostPath volumes, which the agent needs for the CRI socket", scc.Name)
	}
	if !slices.Contains(scc.RequiredDropCapabilities, corev1.Capability("ALL")) {
		t.Errorf("SCC %s does not require dropping ALL capabilities: %v", scc.Name, scc.RequiredDropCapabilities)
	}
	if len(scc.AllowedCapabilities) > 0 {
		t.Errorf("SCC %s allows capabilities %v", scc.Name, scc.AllowedCapabilities)
	}
	if scc.AllowPrivilegeEscalation != nil && *scc.AllowPrivilegeEscalation {
		t.Errorf("SCC %s allows privilege escalation", scc.Name)
	}
	if len(scc.Users) > 0 || len(scc.Groups) > 0 {
		t.Errorf("SCC %s grants itself to users %v / groups %v; access must come only from the Role's `use`", scc.Name, scc.Users, scc.Groups)
	}
	return scc
}

func decodeSCC(o *unstructured.Unstructured) (*securityv1.SecurityContextConstraints, error) {
	data, err := json.Marshal(o.Object)
	if err != nil {
		return nil, err
	}
	var scc securityv1.SecurityContextConstraints
	if err := yaml.UnmarshalStrict(data, &scc); err != nil {
		return nil, fmt.Errorf("strict decode into %s: %w", securityv1.GroupVersion, err)
	}
	return &scc, nil
}

// checkOpenShiftWiring checks what OpenShift's SCC admission would check
// for the DaemonSet's pods: the pod asks for the rendered SCC by name, a Role
// bound to its ServiceAccount grants `use` on that SCC, and the SCC admits
// the pod's volumes, SELinux type and security context. Names must agree
// after every namePrefix and namespace change, which is what the
// configurations file in kustomize/base is for.
func checkOpenShiftWiring(t *testing.T, manifests []byte) {
	t.Helper()
	objs := decodeObjects(t, manifests)
	var (
		sccs     = map[string]*securityv1.SecurityContextConstraints{}
		roles    []rbacv1.Role
		bindings []rbacv1.RoleBinding
		dss      []appsv1.DaemonSet
	)
	for _, o := range objs {
		switch o.GroupVersionKind().GroupKind().String() {
		case "SecurityContextConstraints." + sccGroup:
			if scc, err := decodeSCC(o); err == nil {
				sccs[scc.Name] = scc
			} else {
				t.Errorf("SCC %s: %v", o.GetName(), err)
			}
		case "Role.rbac.authorization.k8s.io":
			var r rbacv1.Role
			fromUnstructured(t, o, &r)
			roles = append(roles, r)
		case "RoleBinding.rbac.authorization.k8s.io":
			var b rbacv1.RoleBinding
			fromUnstructured(t, o, &b)
			bindings = append(bindings, b)
		case "DaemonSet.apps":
			var d appsv1.DaemonSet
			fromUnstructured(t, o, &d)
			dss = append(dss, d)
		}
	}
	if len(sccs) == 0 || len(dss) == 0 {
		t.Fatalf("OpenShift output needs an SCC and a DaemonSet; got %d SCCs, %d DaemonSets", len(sccs), len(dss))
	}
	for _, ds := range dss {
		pod := ds.Spec.Template
		want := pod.Annotations["openshift.io/required-scc"]
		scc, ok := sccs[want]
		if !ok {
			t.Errorf("DaemonSet %s/%s requires SCC %q, which is not in the output (have %v)", ds.Namespace, ds.Name, want, keys(sccs))
			continue
		}
		sa := pod.Spec.ServiceAccountName
		if !canUseSCC(roles, bindings, ds.Namespace, sa, scc.Name) {
			t.Errorf("ServiceAccount %s/%s has no Role granting `use` on SCC %q", ds.Namespace, sa, scc.Name)
		}
		for _, v := range sccViolations(scc, pod.Spec) {
			t.Errorf("DaemonSet %s/%s vs SCC %s: %s", ds.Namespace, ds.Name, scc.Name, v)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func fromUnstructured(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

func canUseSCC(roles []rbacv1.Role, bindings []rbacv1.RoleBinding, ns, sa, scc string) bool {
	for _, b := range bindings {
		if b.Namespace != ns || b.RoleRef.Kind != "Role" {
			continue
		}
		bound := slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && (s.Namespace == "" || s.Namespace == ns)
		})
		if !bound {
			continue
		}
		for _, r := range roles {
			if r.Namespace != ns || r.Name != b.RoleRef.Name {
				continue
			}
			for _, rule := range r.Rules {
				if slices.Contains(rule.APIGroups, sccGroup) && slices.Contains(rule.Resources, "securitycontextconstraints") &&
					slices.Contains(rule.Verbs, "use") && slices.Contains(rule.ResourceNames, scc) {
					return true
				}
			}
		}
	}
	return false
}

// sccViolations is a small model of SCC admission, enough for the fields
// the function renders.
func sccViolations(scc *securityv1.SecurityContextConstraints, spec corev1.PodSpec) []string {
	var v []string
	allowed := func(fs securityv1.FSType) bool {
		return slices.Contains(scc.Volumes, securityv1.FSTypeAll) || slices.Contains(scc.Volumes, fs)
	}
	for _, vol := range spec.Volumes {
		var fs securityv1.FSType
		switch {
		case vol.HostPath != nil:
			fs = securityv1.FSTypeHostPath
		case vol.ConfigMap != nil:
			fs = securityv1.FSTypeConfigMap
		case vol.Secret != nil:
			fs = securityv1.FSTypeSecret
		case vol.EmptyDir != nil:
			fs = securityv1.FSTypeEmptyDir
		case vol.Projected != nil:
			fs = securityv1.FSProjected
		case vol.DownwardAPI != nil:
			fs = securityv1.FSTypeDownwardAPI
		default:
			v = append(v, fmt.Sprintf("volume %s has a type this check does not know", vol.Name))
			continue
		}
		if !allowed(fs) {
			v = append(v, fmt.Sprintf("volume %s (%s) not allowed; SCC volumes: %v", vol.Name, fs, scc.Volumes))
		}
	}
	// The ServiceAccount admission plugin adds a projected token volume to
	// every pod that automounts its token, and the agent needs that token.
	if (spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken) && !allowed(securityv1.FSProjected) {
		v = append(v, "the service-account token is a projected volume, which the SCC does not allow")
	}
	if spec.HostNetwork && !scc.AllowHostNetwork {
		v = append(v, "hostNetwork not allowed")
	}
	if spec.HostPID && !scc.AllowHostPID {
		v = append(v, "hostPID not allowed")
	}
	if scc.SELinuxContext.Type == securityv1.SELinuxStrategyMustRunAs && scc.SELinuxContext.SELinuxOptions != nil {
		want := scc.SELinuxContext.SELinuxOptions.Type
		got := ""
		if spec.SecurityContext != nil && spec.SecurityContext.SELinuxOptions != nil {
			got = spec.SecurityContext.SELinuxOptions.Type
		}
		if want != "" && got != want {
			v = append(v, fmt.Sprintf("pod SELinux type %q, SCC requires %q", got, want))
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		sc := c.SecurityContext
		if sc == nil {
			v = append(v, fmt.Sprintf("container %s has no securityContext", c.Name))
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			v = append(v, fmt.Sprintf("container %s is privileged", c.Name))
		}
		if sc.Capabilities != nil {
			for _, add := range sc.Capabilities.Add {
				if !slices.Contains(scc.AllowedCapabilities, add) {
					v = append(v, fmt.Sprintf("container %s adds capability %s", c.Name, add))
				}
			}
		}
		if slices.Contains(scc.RequiredDropCapabilities, "ALL") &&
			(sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL")) {
			v = append(v, fmt.Sprintf("container %s does not drop ALL capabilities", c.Name))
		}
		if scc.ReadOnlyRootFilesystem && (sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem) {
			v = append(v, fmt.Sprintf("container %s: SCC requires a read-only root filesystem", c.Name))
		}
	}
	return v
}

// lines is for error messages listing several objects.
func lines(ss []string) string { return "\n  " + strings.Join(ss, "\n  ") }

// Pod Security Admission rejects the agent's pod in a namespace below
// `privileged`, because of the hostPath volume, and admits it at
// `privileged`: the reason every example labels its namespace. The pod is
// the DaemonSet's template from the vanilla overlay's golden output.
func testPodSecurity(t *testing.T, tl tools, api *apiServer) {
	data, err := os.ReadFile(filepath.Join(tl.root, "kustomize/overlays/vanilla/expected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	fromUnstructured(t, only(t, decodeObjects(t, data), "DaemonSet"), &ds)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := api.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	for _, level := range []string{"privileged", "baseline", "restricted"} {
		ns := "psa-" + level
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ds.Spec.Template.Spec.ServiceAccountName, Namespace: ns}}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: ns, Labels: ds.Spec.Template.Labels}, Spec: ds.Spec.Template.Spec}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case level == "privileged" && err != nil:
			t.Errorf("enforce=privileged rejected the agent pod: %v", err)
		case level != "privileged" && err == nil:
			t.Errorf("enforce=%s admitted the agent pod; docs/security.md says hostPath needs privileged", level)
		case level != "privileged" && !strings.Contains(err.Error(), "hostPath"):
			t.Errorf("enforce=%s rejected the agent pod for another reason than hostPath: %v", level, err)
		}
	}
}
