package slots_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/slots"
	"github.com/image-prefetcher/image-prefetcher/fn/render"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Against the real apiserver (its RBAC, its watch cache), waiting nodes
// send nothing while the only slot stays busy (a waiter alone in the
// queue looks every 5 s, after this window), and one of them takes it as soon
// as it is released.
func (e *testEnv) testQuietWaiters(t *testing.T) {
	const n, instance = 8, "quiet"
	token := e.agentToken(t, instance, 1)
	holder := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "holder", LeaseDuration: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := holder.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	got := make(chan *slots.Holding, n)
	for range n {
		g := e.countedGate(t, token, instance, slots.Config{Slots: 1, Identity: "waiter", LeaseDuration: time.Hour}, &calls)
		go func() {
			h, err := g.Hold(ctx)
			if err == nil {
				got <- h
			}
		}()
	}
	// Every waiter writes its ticket, lists the slots and the tickets, and
	// watches its ticket: four requests each.
	for calls.Load() < 4*n {
		time.Sleep(10 * time.Millisecond)
	}
	before := calls.Load()
	time.Sleep(3 * time.Second)
	quiet := calls.Load() - before
	t.Logf("%d waiters sent %d requests in 3 s while the slot was busy", n, quiet)
	if quiet != 0 {
		t.Errorf("waiting nodes sent %d requests while nothing changed, want 0", quiet)
	}
	a.Release()
	select {
	case h := <-got:
		h.Release()
	case <-ctx.Done():
		t.Fatal("no waiter took the released slot")
	}
}

// A Role rendered before waiting by watch has no list or watch on Leases.
// With the real RBAC, the wait ends with an error that says what to do,
// once the refusal has lasted RefusedFor (a restarted apiserver refuses
// for a moment too).
func (e *testEnv) testOldRole(t *testing.T) {
	const instance = "oldrole"
	token := e.agentToken(t, instance, 1)
	e.oldRole(t, instance, 1)
	g := e.gate(t, token, instance, slots.Config{Slots: 1, Identity: "pod", LeaseDuration: time.Hour, RefusedFor: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := g.Hold(ctx)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "render the instance again") {
		t.Fatalf("Hold under the old Role: %v, want the refusal and what to do", err)
	}
}

// oldRole gives the instance's Role the Lease rules rendered before
// waiting by watch: create, and reads and writes of the k slots by name.
func (e *testEnv) oldRole(t *testing.T, instance string, k int) {
	t.Helper()
	ctx := context.Background()
	roles := e.admin.RbacV1().Roles(e.ns)
	role, err := roles.Get(ctx, render.NamesFor(e.ns, instance).Namespaced, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Role: %v", err)
	}
	var names []string
	for i := range k {
		names = append(names, slots.SlotName(instance, i))
	}
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "leases") })
	role.Rules = append(role.Rules,
		rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "update", "delete"}, ResourceNames: names})
	if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update Role: %v", err)
	}
	leases := e.agentClient(t, e.token(t, instance)).CoordinationV1().Leases(e.ns)
	if err := cluster.Poll(ctx, 100*time.Millisecond, "the old Role of "+instance, func() (bool, string) {
		_, err := leases.List(ctx, metav1.ListOptions{})
		return apierrors.IsForbidden(err), fmt.Sprintf("a list of Leases: %v", err)
	}); err != nil {
		t.Fatal(err)
	}
}
