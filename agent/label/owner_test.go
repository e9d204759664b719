package label

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestNewOwnerIDIsStablePerNamespaceAndName(t *testing.T) {
	a := NewOwner("team-a", "web")
	if again := NewOwner("team-a", "web"); again != a {
		t.Errorf("re-created instance gets %+v, was %+v", again, a)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(a.ID) {
		t.Errorf("ID %q is not a version 5 UUID", a.ID)
	}
	for _, o := range []Owner{NewOwner("team-b", "web"), NewOwner("team-a", "web2"), NewOwner("team-a-w", "eb"), NewOwner("team", "a/web")} {
		if o.ID == a.ID {
			t.Errorf("%s and %s share the ID %s", o, a, a.ID)
		}
	}
}

func TestOwns(t *testing.T) {
	a, b := NewOwner("team-a", "web"), NewOwner("team-b", "web")
	summary := func(o *Owner) string {
		s := NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
		s.Owner = o
		return s.Marshal()
	}
	cases := []struct {
		name      string
		ann       string
		aOwns     bool
		bOwns     bool
		isClaimed bool
		theirs    Owner
	}{
		{"written by a", summary(&a), true, false, true, a},
		{"written by b", summary(&b), false, true, true, b},
		{"no owner (earlier release, reference agent)", summary(nil), true, true, false, Owner{}},
		{"written by hand", "done", true, true, false, Owner{}},
		{"empty", "", true, true, false, Owner{}},
		{"owner only in a message", `{"total":1,"failed":[{"image":"x","reason":"owner","message":"\"owner\": me"}]}`, true, true, false, Owner{}},
		{"owner not first", `{"total":1,"owner":{"namespace":"team-a","name":"web","id":"x"}}`, false, false, true, Owner{Namespace: "team-a", Name: "web", ID: "x"}},
		{"unreadable owner", `{"owner": {`, false, false, true, Owner{}},
		{"prefix of another namespace", strings.Replace(summary(&a), `"team-a"`, `"team-a-2"`, 1), false, false, true, Owner{Namespace: "team-a-2", Name: "web", ID: a.ID}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.Owns(tc.ann); got != tc.aOwns {
				t.Errorf("team-a owns %q: %v", tc.ann, got)
			}
			if got := b.Owns(tc.ann); got != tc.bOwns {
				t.Errorf("team-b owns %q: %v", tc.ann, got)
			}
			theirs, isClaimed := Claim(tc.ann)
			if isClaimed != tc.isClaimed || theirs != tc.theirs {
				t.Errorf("Claim: %+v %v, want %+v %v", theirs, isClaimed, tc.theirs, tc.isClaimed)
			}
		})
	}
}

// TestOwnsCopies: one instance applied twice under two namePrefixes is told
// apart by DaemonSet. A record of an earlier release (no DaemonSet) is every
// copy's, and an owner without a DaemonSet (status --cleanup) owns every
// copy's record.
func TestOwnsCopies(t *testing.T) {
	copyOf := func(ds string) Owner { o := NewOwner("team-a", "web"); o.DaemonSet = ds; return o }
	a, b, any, other := copyOf("a-image-prefetcher-web"), copyOf("b-image-prefetcher-web"), copyOf(""), NewOwner("team-b", "web")
	ann := func(o Owner) string {
		s := NewSummary(1, 1, nil, time.Second, time.Unix(0, 0))
		s.Owner = &o
		return s.Marshal()
	}
	cases := []struct {
		name                  string
		ann                   string
		aOwns, bOwns, anyOwns bool
	}{
		{"written by copy a", ann(a), true, false, true},
		{"written by copy b", ann(b), false, true, true},
		{"written by an earlier release", ann(any), true, true, true},
		{"written by another instance", ann(other), false, false, false},
		{"a copy whose DaemonSet name extends a's", ann(copyOf("a-image-prefetcher-web-2")), false, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, o := range []struct {
				owner Owner
				want  bool
			}{{a, tc.aOwns}, {b, tc.bOwns}, {any, tc.anyOwns}} {
				if got := o.owner.Owns(tc.ann); got != o.want {
					t.Errorf("%+v owns %s: %v, want %v", o.owner, tc.ann, got, o.want)
				}
			}
		})
	}
	if !strings.HasPrefix(ann(a), `{"owner":{"namespace":"team-a","name":"web","daemonSet":"a-image-prefetcher-web","id":"`) {
		t.Errorf("record %s: the DaemonSet must follow the instance, as the admission policy reads it", ann(a))
	}
}

// patches lists the patches sent to the fake API server.
func patches(c *fake.Clientset) []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func nodeWith(ann map[string]string, labels map[string]string) *fake.Clientset {
	return fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "7", Labels: labels, Annotations: ann}})
}

func TestOwnedApplyAdoptsAnUnownedKeyInOnePatch(t *testing.T) {
	legacy := `{"total":1,"present":1,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z"}`
	c := nodeWith(map[string]string{key: legacy}, map[string]string{key: "succeeded", "x": "y"})
	a := NewOwner("team-a", "demo")
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Owner: &a}
	if err := l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now())); err != nil {
		t.Fatal(err)
	}
	n := get(t, c, "n1")
	if n.Labels[key] != "succeeded" || !strings.HasPrefix(n.Annotations[key], a.Prefix()) || n.Labels["x"] != "y" {
		t.Errorf("labels %v annotations %v", n.Labels, n.Annotations)
	}
	s, err := Parse(n.Annotations[key])
	if err != nil || s.Owner == nil || *s.Owner != a {
		t.Errorf("owner %+v (%v)", s.Owner, err)
	}
	// Adopting is one write of the new value: the label never goes away
	// or through another value on the way.
	ps := patches(c)
	if len(ps) != 1 || strings.Contains(string(ps[0].GetPatch()), "null") || !strings.Contains(string(ps[0].GetPatch()), `"resourceVersion":"7"`) {
		t.Errorf("patches: %d, first %s", len(ps), ps[0].GetPatch())
	}
}

func TestOwnedLabelerLeavesAnotherOwnersKeyAlone(t *testing.T) {
	a, b := NewOwner("team-a", "demo"), NewOwner("team-b", "demo")
	s := NewSummary(2, 1, []Failure{{Image: "x", Reason: "NotFound"}}, time.Second, time.Now())
	s.Owner = &a
	ann := s.Marshal()
	for _, op := range []string{"apply", "remove"} {
		t.Run(op, func(t *testing.T) {
			c := nodeWith(map[string]string{key: ann}, map[string]string{key: "failed"})
			l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Owner: &b, Sleep: func(time.Duration) { t.Error("a conflict is not retried") }}
			var err error
			if op == "apply" {
				err = l.Apply(context.Background(), NewSummary(1, 1, nil, time.Second, time.Now()))
			} else {
				err = l.Remove(context.Background(), time.Second)
			}
			var ce *OwnerConflictError
			if !errors.As(err, &ce) || ce.Theirs != a || ce.Ours != b {
				t.Fatalf("err %v, want a conflict naming both owners", err)
			}
			for _, want := range []string{"team-a/demo", "team-b/demo", key} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not name %s", err, want)
				}
			}
			if n := get(t, c, "n1"); n.Labels[key] != "failed" || n.Annotations[key] != ann {
				t.Errorf("key changed: %v %v", n.Labels, n.Annotations)
			}
			if ps := patches(c); len(ps) != 0 {
				t.Errorf("%d patches sent", len(ps))
			}
		})
	}
}

func TestOwnedRemove(t *testing.T) {
	a := NewOwner("team-a", "demo")
	s := NewSummary(1, 1, nil, time.Second, time.Now())
	s.Owner = &a
	c := nodeWith(map[string]string{key: s.Marshal(), "o": "p"}, map[string]string{key: "succeeded"})
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Owner: &a}
	if err := l.Remove(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if n := get(t, c, "n1"); len(n.Labels) != 0 || len(n.Annotations) != 1 {
		t.Errorf("after remove: %v %v", n.Labels, n.Annotations)
	}
	// Removing again is harmless: the key is nobody's.
	if err := l.Remove(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestOwnedApplyLosesARace: another instance claims the key between the
// read and the patch. The patch carries the resourceVersion that was read,
// so the API server refuses it, and the re-read finds the new owner.
func TestOwnedApplyLosesARace(t *testing.T) {
	a, b := NewOwner("team-a", "demo"), NewOwner("team-b", "demo")
	c := nodeWith(nil, nil)
	raced := false
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if raced {
			t.Error("patched after the key was claimed")
			return false, nil, nil
		}
		raced = true
		s := NewSummary(1, 1, nil, time.Second, time.Now())
		s.Owner = &a
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
		obj, err := c.Tracker().Get(gvr, "", "n1")
		if err != nil {
			t.Fatal(err)
		}
		n := obj.(*corev1.Node).DeepCopy()
		n.Labels = map[string]string{key: "succeeded"}
		n.Annotations = map[string]string{key: s.Marshal()}
		n.ResourceVersion = "8"
		if err := c.Tracker().Update(gvr, n, ""); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("the object has been modified"))
	})
	l := &Labeler{Nodes: c.CoreV1().Nodes(), Node: "n1", Key: key, Owner: &b}
	err := l.Apply(context.Background(), NewSummary(1, 0, []Failure{{Image: "x", Reason: "NotFound"}}, time.Second, time.Now()))
	if !IsOwnerConflict(err) {
		t.Fatalf("err %v, want an owner conflict", err)
	}
	if n := get(t, c, "n1"); n.Labels[key] != "succeeded" || !strings.HasPrefix(n.Annotations[key], a.Prefix()) {
		t.Errorf("the winner's key changed: %v %v", n.Labels, n.Annotations)
	}
}

func TestSameComparesOwners(t *testing.T) {
	a, b := NewOwner("team-a", "demo"), NewOwner("team-b", "demo")
	s := NewSummary(1, 1, nil, time.Second, time.Now())
	withA, withB := s, s
	withA.Owner, withB.Owner = &a, &b
	if s.Same(withA) || withA.Same(withB) || !withA.Same(withA) {
		t.Error("Same ignores the owner: an unowned key would never be adopted by watch")
	}
}
