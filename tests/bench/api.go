package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

const serviceAccount = "image-prefetcher"

// setupAPI creates the Node objects, and a service account with exactly
// the agent's RBAC (see the fn/agent contract), and writes a kubeconfig
// with its token for the agents.
func (b *bench) setupAPI(ctx context.Context) error {
	cs, err := b.c.Clientset()
	if err != nil {
		return err
	}
	for _, n := range b.nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", n.Name, err)
		}
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service account: %w", err)
	}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccount, Namespace: namespace}}
	cr := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-bench"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}}},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create cluster role: %w", err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-bench"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name},
		Subjects:   subject,
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create cluster role binding: %w", err)
	}
	var slotNames []string
	for _, cfg := range b.opts.Configs {
		for i := range cfg.MaxConcurrentNodes {
			slotNames = append(slotNames, slots.SlotName(instancePrefix+cfg.Name, i))
		}
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if len(slotNames) > 0 {
		rules = append(rules,
			rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "list", "watch"}},
			rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "update", "delete"}, ResourceNames: slotNames},
		)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-bench", Namespace: namespace}, Rules: rules}
	if _, err := cs.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create role: %w", err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-bench", Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   subject,
	}
	if _, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create role binding: %w", err)
	}
	expiry := int64(4 * time.Hour / time.Second)
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service account token: %w", err)
	}
	return b.writeAgentKubeconfig(tok.Status.Token)
}

func (b *bench) writeAgentKubeconfig(token string) error {
	admin, err := clientcmd.LoadFromFile(b.c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("read admin kubeconfig: %w", err)
	}
	ctxName := admin.CurrentContext
	kctx := admin.Contexts[ctxName]
	if kctx == nil || admin.Clusters[kctx.Cluster] == nil {
		return fmt.Errorf("admin kubeconfig %s has no usable current context", b.c.Kubeconfig)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["bench"] = admin.Clusters[kctx.Cluster].DeepCopy()
	cfg.AuthInfos[serviceAccount] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: serviceAccount, Namespace: namespace}
	cfg.CurrentContext = "bench"
	b.kubecf = filepath.Join(b.dir, "agent.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, b.kubecf); err != nil {
		return fmt.Errorf("write agent kubeconfig: %w", err)
	}
	return nil
}

// clearLabels removes the instance's label and annotation from nodes, so
// that a run's completions are that run's.
func (b *bench) clearLabels(ctx context.Context, nodes []*cluster.Node, instance string) error {
	cs, err := b.c.Clientset()
	if err != nil {
		return err
	}
	key := v1alpha1.LabelDomain + "/" + instance
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{key: nil}, "annotations": map[string]any{key: nil},
	}})
	if err != nil {
		return fmt.Errorf("encode patch: %w", err)
	}
	for _, n := range nodes {
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("clear label on %s: %w", n.Name, err)
		}
	}
	return nil
}

type labelSeen struct {
	at    time.Duration
	value string
}

// watcher samples node labels and slot Leases during a run.
type watcher struct {
	b           *bench
	cs          kubernetes.Interface
	instance    string
	nodes       []*cluster.Node
	t0          time.Time
	seen        map[string]labelSeen
	peakHolders int
}

func (w *watcher) sample(ctx context.Context) {
	now := time.Since(w.t0)
	if w.cs == nil {
		cs, err := w.b.c.Clientset()
		if err != nil {
			return
		}
		w.cs = cs
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	key := v1alpha1.LabelDomain + "/" + w.instance
	if list, err := w.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, node := range list.Items {
			if _, done := w.seen[node.Name]; done {
				continue
			}
			if v, ok := node.Labels[key]; ok {
				w.seen[node.Name] = labelSeen{at: now, value: v}
			}
		}
	}
	if leases, err := w.cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{}); err == nil {
		held := 0
		for _, l := range leases.Items {
			if strings.HasPrefix(l.Name, w.instance+"-slot-") && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
				held++
			}
		}
		w.peakHolders = max(w.peakHolders, held)
	}
}
