package hold

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// fakeObjects keeps object metadata by path and applies merge patches of
// metadata.finalizers against metadata.resourceVersion, as the API server
// does.
type fakeObjects struct {
	mu      sync.Mutex
	objs    map[string]*metav1.ObjectMeta
	patches int
	// conflicts makes the next n patches fail as if another writer won.
	conflicts int
}

func (f *fakeObjects) Meta(_ context.Context, path string) (*metav1.ObjectMeta, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.objs[path]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{}, path)
	}
	return m.DeepCopy(), nil
}

func (f *fakeObjects) MergePatch(_ context.Context, path string, patch []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patches++
	m, ok := f.objs[path]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{}, path)
	}
	var p struct {
		Metadata struct {
			ResourceVersion string   `json:"resourceVersion"`
			Finalizers      []string `json:"finalizers"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return err
	}
	if f.conflicts > 0 || p.Metadata.ResourceVersion != m.ResourceVersion {
		f.conflicts--
		bumpRV(m)
		return apierrors.NewConflict(schema.GroupResource{}, path, fmt.Errorf("stale"))
	}
	if m.DeletionTimestamp != nil && len(p.Metadata.Finalizers) > 0 {
		for _, fin := range p.Metadata.Finalizers {
			if !slices.Contains(m.Finalizers, fin) {
				return apierrors.NewForbidden(schema.GroupResource{}, path, fmt.Errorf("no new finalizers can be added if the object is being deleted"))
			}
		}
	}
	m.Finalizers = p.Metadata.Finalizers
	bumpRV(m)
	return nil
}

func bumpRV(m *metav1.ObjectMeta) {
	n, _ := strconv.Atoi(m.ResourceVersion)
	m.ResourceVersion = strconv.Itoa(n + 1)
}

func (f *fakeObjects) finalizers(path string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objs[path].Finalizers
}

// fakeNodes serves node lists whose content a test changes over time.
type fakeNodes struct {
	mu    sync.Mutex
	items []corev1.Node
	lists int
	// onList, when set, runs before each list is answered.
	onList func(n int, f *fakeNodes)
}

func (f *fakeNodes) Get(context.Context, string, metav1.GetOptions) (*corev1.Node, error) {
	return nil, fmt.Errorf("not used")
}

func (f *fakeNodes) List(_ context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.onList != nil {
		f.onList(f.lists, f)
	}
	out := &corev1.NodeList{}
	for _, n := range f.items {
		if _, ok := n.Labels[opts.LabelSelector]; ok {
			out.Items = append(out.Items, n)
		}
	}
	return out, nil
}

func (f *fakeNodes) Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*corev1.Node, error) {
	return nil, fmt.Errorf("not used")
}

var inst = v1alpha1.Instance{Namespace: "prefetch", Name: "web"}

const key = "image-prefetcher.stackrox.io/web"

func ownerPrefix() string { return inst.CopyPrefix("image-prefetcher-web") }

// node carries the key for owner prefix p.
func node(name, p string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels:      map[string]string{key: "succeeded"},
		Annotations: map[string]string{key: p + `"id":"x"}}`}}}
}

func objects(deleted map[int]time.Time, finalizers ...string) *fakeObjects {
	f := &fakeObjects{objs: map[string]*metav1.ObjectMeta{}}
	for i, h := range inst.Held() {
		m := &metav1.ObjectMeta{Name: h.Name, ResourceVersion: "1", Finalizers: slices.Clone(finalizers)}
		if at, ok := deleted[i]; ok {
			m.DeletionTimestamp = &metav1.Time{Time: at}
		}
		f.objs[h.Path()] = m
	}
	return f
}

func holder(o *fakeObjects, n *fakeNodes) *Holder {
	return &Holder{Objects: o, Nodes: n, Held: inst.Held(), Key: key, OwnerPrefix: ownerPrefix(), Poll: time.Millisecond}
}

func TestHold(t *testing.T) {
	other := "example.com/keep"
	for _, tc := range []struct {
		name    string
		objs    *fakeObjects
		missing int // index of a held object that does not exist, -1: none
		want    []string
		// conflicts: patches that lose a race first.
		conflicts int
	}{
		{name: "none yet", objs: objects(nil), missing: -1, want: []string{Finalizer}},
		{name: "another finalizer is kept", objs: objects(nil, other), missing: -1, want: []string{other, Finalizer}},
		{name: "already held", objs: objects(nil, Finalizer), missing: -1, want: []string{Finalizer}},
		{name: "renamed after the function ran", objs: objects(nil), missing: 3, want: []string{Finalizer}},
		{name: "lost races", objs: objects(nil), missing: -1, want: []string{Finalizer}, conflicts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.missing >= 0 {
				delete(tc.objs.objs, inst.Held()[tc.missing].Path())
			}
			tc.objs.conflicts = tc.conflicts
			h := holder(tc.objs, &fakeNodes{})
			if err := h.Hold(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := h.Hold(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i, o := range inst.Held() {
				if i == tc.missing {
					continue
				}
				if got := tc.objs.finalizers(o.Path()); !slices.Equal(got, tc.want) {
					t.Errorf("%s: finalizers %v, want %v", o, got, tc.want)
				}
			}
		})
	}
}

// An object already being deleted is not held again (the API server
// refuses new finalizers then).
func TestHoldSkipsObjectsBeingDeleted(t *testing.T) {
	o := objects(map[int]time.Time{0: time.Now()})
	if err := holder(o, &fakeNodes{}).Hold(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := o.finalizers(inst.Held()[0].Path()); len(got) != 0 {
		t.Errorf("object being deleted got finalizers %v", got)
	}
}

// Settle releases once no node carries this instance's key: another
// instance's key of the same name (another namespace) does not count.
func TestSettleWaitsForTheOtherNodes(t *testing.T) {
	o := objects(map[int]time.Time{0: time.Now(), 3: time.Now()}, Finalizer, "example.com/keep")
	other := v1alpha1.Instance{Namespace: "elsewhere", Name: "web"}.CopyPrefix("image-prefetcher-web")
	n := &fakeNodes{items: []corev1.Node{node("a", ownerPrefix()), node("b", other)}}
	n.onList = func(i int, f *fakeNodes) {
		if i == 4 {
			f.items = f.items[1:] // node a's agent cleaned it
		}
		for _, p := range inst.Held() {
			if !slices.Contains(o.finalizers(p.Path()), Finalizer) {
				t.Errorf("%s released while node a still carried the key", p)
			}
		}
	}
	if err := holder(o, n).Settle(context.Background(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if n.lists != 4 {
		t.Errorf("listed the nodes %d times, want 4 (until node a was clean)", n.lists)
	}
	for _, p := range inst.Held() {
		if got := o.finalizers(p.Path()); !slices.Equal(got, []string{"example.com/keep"}) {
			t.Errorf("%s: finalizers %v after Settle, want only the other one", p, got)
		}
	}
}

// A node whose agent never cleans (its node is down) holds the objects
// until the deadline only.
func TestSettleReleasesAtTheDeadline(t *testing.T) {
	o := objects(map[int]time.Time{0: time.Now()}, Finalizer)
	n := &fakeNodes{items: []corev1.Node{node("down", ownerPrefix())}}
	start := time.Now()
	if err := holder(o, n).Settle(context.Background(), start.Add(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Settle took %s with a deadline of 100ms", took)
	}
	for _, p := range inst.Held() {
		if got := o.finalizers(p.Path()); len(got) != 0 {
			t.Errorf("%s: finalizers %v after the deadline, want none", p, got)
		}
	}
}

// Stray releases objects deleted a while ago while the agent runs (deleted
// alone, not as part of an uninstall), not those deleted just now.
func TestStray(t *testing.T) {
	now := time.Now()
	o := objects(map[int]time.Time{1: now.Add(-2 * strayAfter), 2: now.Add(-time.Second)}, Finalizer)
	if err := holder(o, &fakeNodes{}).Stray(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	for i, p := range inst.Held() {
		want := []string{Finalizer}
		if i == 1 {
			want = []string{}
		}
		if got := o.finalizers(p.Path()); !slices.Equal(got, want) {
			t.Errorf("%s: finalizers %v, want %v", p, got, want)
		}
	}
}
