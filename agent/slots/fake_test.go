package slots

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const testNS = "prefetch"

var leasesGVR = coordinationv1.SchemeGroupVersion.WithResource("leases")

// fakeAPI is client-go's fake clientset plus what it lacks and the real
// apiserver has: resourceVersions that change on every write, conflicts
// for updates that carry a stale one, a list that says at which version
// it was read, and watches that start from such a version, so that no
// write between a list and its watch is missed. A hook can fail or
// interfere with calls.
type fakeAPI struct {
	cs *fake.Clientset

	mu   sync.Mutex
	rv   int64
	hook func(verb, name string, lease *coordinationv1.Lease) error

	// writes serializes a write with its version and its event, and a
	// list with its version.
	writes   sync.Mutex
	events   []watch.Event
	watchers []*fakeWatcher
	lists    int
	// watchable is the oldest version a watch may start from; one from
	// before it is answered 410 Gone (restart).
	watchable int64
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{cs: fake.NewSimpleClientset()}
	f.cs.PrependReactor("*", "leases", f.react)
	f.cs.PrependWatchReactor("leases", f.watch)
	t.Cleanup(f.stopWatchers)
	return f
}

// fakeWatcher is one watch: events at most fakeWatchBuffer behind.
type fakeWatcher struct {
	ch       chan watch.Event
	selector labels.Selector
	name     string // a field selector on metadata.name, if any
	once     sync.Once
	f        *fakeAPI
}

const fakeWatchBuffer = 4096

func (w *fakeWatcher) ResultChan() <-chan watch.Event { return w.ch }

func (w *fakeWatcher) Stop() {
	w.f.writes.Lock()
	defer w.f.writes.Unlock()
	w.f.watchers = slices.DeleteFunc(w.f.watchers, func(o *fakeWatcher) bool { return o == w })
	w.close()
}

func (w *fakeWatcher) close() { w.once.Do(func() { close(w.ch) }) }

func (w *fakeWatcher) send(ev watch.Event) {
	l := ev.Object.(*coordinationv1.Lease)
	if !w.selector.Matches(labels.Set(l.Labels)) || (w.name != "" && l.Name != w.name) {
		return
	}
	select {
	case w.ch <- watch.Event{Type: ev.Type, Object: l.DeepCopy()}:
	default:
		panic("fake watch: reader fell behind")
	}
}

func (f *fakeAPI) watch(action k8stesting.Action) (bool, watch.Interface, error) {
	f.mu.Lock()
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		if err := hook("watch", "", nil); err != nil {
			return true, nil, err
		}
	}
	r := action.(k8stesting.WatchAction).GetWatchRestrictions()
	from, _ := strconv.ParseInt(r.ResourceVersion, 10, 64)
	sel := r.Labels
	if sel == nil {
		sel = labels.Everything()
	}
	w := &fakeWatcher{ch: make(chan watch.Event, fakeWatchBuffer), selector: sel, f: f}
	if r.Fields != nil {
		w.name, _ = r.Fields.RequiresExactMatch("metadata.name")
	}
	f.writes.Lock()
	defer f.writes.Unlock()
	if from > 0 && from < f.watchable {
		w.ch <- watch.Event{Type: watch.Error, Object: &apierrors.NewGone("too old resource version").ErrStatus}
		w.close()
		return true, w, nil
	}
	for _, ev := range f.events {
		if rv, _ := strconv.ParseInt(ev.Object.(*coordinationv1.Lease).ResourceVersion, 10, 64); rv > from {
			w.send(ev)
		}
	}
	f.watchers = append(f.watchers, w)
	return true, w, nil
}

// record logs a write for watches; the caller holds f.writes.
func (f *fakeAPI) record(typ watch.EventType, lease *coordinationv1.Lease) {
	ev := watch.Event{Type: typ, Object: lease.DeepCopy()}
	f.events = append(f.events, ev)
	for _, w := range f.watchers {
		w.send(ev)
	}
}

// endWatches ends every watch, as an apiserver does at its timeout.
func (f *fakeAPI) endWatches() {
	f.writes.Lock()
	defer f.writes.Unlock()
	for _, w := range f.watchers {
		w.close()
	}
	f.watchers = nil
}

func (f *fakeAPI) stopWatchers() { f.endWatches() }

// restart ends every watch as a restarting apiserver does: its new watch
// cache starts at the current version, and a watch from any version
// before it is answered 410 Gone.
func (f *fakeAPI) restart() {
	f.writes.Lock()
	f.mu.Lock()
	f.watchable = f.rv
	f.mu.Unlock()
	f.writes.Unlock()
	f.endWatches()
}

// listCount is how many lists the gates made.
func (f *fakeAPI) listCount() int {
	f.writes.Lock()
	defer f.writes.Unlock()
	return f.lists
}

func (f *fakeAPI) setHook(h func(verb, name string, lease *coordinationv1.Lease) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = h
}

func (f *fakeAPI) react(action k8stesting.Action) (bool, runtime.Object, error) {
	f.mu.Lock()
	hook := f.hook
	f.mu.Unlock()
	var name string
	var lease *coordinationv1.Lease
	switch a := action.(type) {
	case k8stesting.GetAction:
		name = a.GetName()
	case k8stesting.CreateAction:
		lease = a.GetObject().(*coordinationv1.Lease).DeepCopy()
		name = lease.Name
	case k8stesting.UpdateAction:
		lease = a.GetObject().(*coordinationv1.Lease).DeepCopy()
		name = lease.Name
	case k8stesting.DeleteAction:
		name = a.GetName()
	}
	if hook != nil {
		if err := hook(action.GetVerb(), name, lease); err != nil {
			return true, nil, err
		}
	}
	tr := f.cs.Tracker()
	f.writes.Lock()
	defer f.writes.Unlock()
	switch action.GetVerb() {
	case "list":
		f.lists++
		obj, err := tr.List(leasesGVR, coordinationv1.SchemeGroupVersion.WithKind("Lease"), testNS)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*coordinationv1.LeaseList)
		r := action.(k8stesting.ListAction).GetListRestrictions()
		if r.Labels != nil {
			list.Items = slices.DeleteFunc(list.Items, func(l coordinationv1.Lease) bool {
				return !r.Labels.Matches(labels.Set(l.Labels))
			})
		}
		if r.Fields != nil {
			if name, ok := r.Fields.RequiresExactMatch("metadata.name"); ok {
				list.Items = slices.DeleteFunc(list.Items, func(l coordinationv1.Lease) bool { return l.Name != name })
			}
		}
		list.ResourceVersion = f.currentRV()
		return true, list, nil
	case "delete":
		obj, err := tr.Get(leasesGVR, testNS, name)
		if err != nil {
			return true, nil, err
		}
		if err := tr.Delete(leasesGVR, testNS, name); err != nil {
			return true, nil, err
		}
		gone := obj.(*coordinationv1.Lease).DeepCopy()
		gone.ResourceVersion = f.nextRV()
		f.record(watch.Deleted, gone)
		return true, gone, nil
	case "create":
		if _, err := tr.Get(leasesGVR, testNS, name); err == nil {
			return true, nil, apierrors.NewAlreadyExists(leasesGVR.GroupResource(), name)
		}
		lease.ResourceVersion = f.nextRV()
		if err := tr.Create(leasesGVR, lease, testNS); err != nil {
			return true, nil, err
		}
		f.record(watch.Added, lease)
		return true, lease, nil
	case "update":
		obj, err := tr.Get(leasesGVR, testNS, name)
		if err != nil {
			return true, nil, err
		}
		if obj.(*coordinationv1.Lease).ResourceVersion != lease.ResourceVersion {
			return true, nil, apierrors.NewConflict(leasesGVR.GroupResource(), name,
				errorString("the object has been modified"))
		}
		lease.ResourceVersion = f.nextRV()
		if err := tr.Update(leasesGVR, lease, testNS); err != nil {
			return true, nil, err
		}
		f.record(watch.Modified, lease)
		return true, lease, nil
	}
	return false, nil, nil
}

// remove deletes a Lease behind the gate's back.
func (f *fakeAPI) remove(t *testing.T, name string) {
	t.Helper()
	f.writes.Lock()
	defer f.writes.Unlock()
	l := f.lease(t, name)
	if err := f.cs.Tracker().Delete(leasesGVR, testNS, name); err != nil {
		t.Fatal(err)
	}
	gone := l.DeepCopy()
	gone.ResourceVersion = f.nextRV()
	f.record(watch.Deleted, gone)
}

type errorString string

func (e errorString) Error() string { return string(e) }

func (f *fakeAPI) currentRV() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strconv.FormatInt(f.rv, 10)
}

func (f *fakeAPI) nextRV() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	return strconv.FormatInt(f.rv, 10)
}

// lease reads a slot Lease straight from the tracker; nil if absent.
func (f *fakeAPI) lease(t *testing.T, name string) *coordinationv1.Lease {
	t.Helper()
	obj, err := f.cs.Tracker().Get(leasesGVR, testNS, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return obj.(*coordinationv1.Lease)
}

// write changes a Lease behind the gate's back, as another node would.
func (f *fakeAPI) write(t *testing.T, name string, change func(*coordinationv1.Lease)) {
	t.Helper()
	cur := f.lease(t, name)
	if cur == nil {
		cur = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}}
		change(cur)
		_, err := f.leases().Create(context.Background(), cur, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return
	}
	next := cur.DeepCopy()
	change(next)
	_, err := f.leases().Update(context.Background(), next, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update %s: %v", name, err)
	}
}

// sneak changes a Lease directly in the tracker, bumping its
// resourceVersion. Hooks use it: they run inside the fake's lock, where a
// call through the clientset would deadlock.
func (f *fakeAPI) sneak(t *testing.T, name string, change func(*coordinationv1.Lease)) {
	t.Helper()
	f.writes.Lock()
	defer f.writes.Unlock()
	next := f.lease(t, name).DeepCopy()
	change(next)
	next.ResourceVersion = f.nextRV()
	if err := f.cs.Tracker().Update(leasesGVR, next, testNS); err != nil {
		t.Errorf("update %s: %v", name, err)
	}
	f.record(watch.Modified, next)
}

// gate builds a Gate on the fake (or on cfg.Client, a wrapper of it).
// Durations below a second are allowed here (New rounds them up for the
// API; tests set them afterwards) so that expiry tests run fast; the Lease
// then says 0 seconds and readers fall back to the configured duration.
// The first pause after a failed call is shortened alike.
func (f *fakeAPI) gate(t *testing.T, cfg Config, leaseDuration time.Duration) *Gate {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = f.leases()
	}
	cfg.Namespace = testNS
	if cfg.Instance == "" {
		cfg.Instance = "demo"
	}
	if cfg.Identity == "" {
		cfg.Identity = "pod"
	}
	cfg.Logger = slog.New(slog.NewTextHandler(debugOut(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if leaseDuration > 0 {
		g.cfg.LeaseDuration = leaseDuration
	}
	g.retry = 10 * time.Millisecond
	return g
}

func (f *fakeAPI) leases() LeaseClient { return f.cs.CoordinationV1().Leases(testNS) }

// hold holds a slot of g. Its context ends only if the wait fails: a
// context that has ended makes a seed's release one that was cut short.
func hold(t *testing.T, g *Gate) *Holding {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	defer time.AfterFunc(30*time.Second, cancel).Stop()
	h, err := g.Hold(ctx)
	if err != nil {
		t.Fatalf("Hold: %v", err)
	}
	t.Cleanup(h.Release)
	return h
}

// crash stops a holding's renewals without releasing, like a killed agent.
func crash(h *Holding) {
	h.stop()
	<-h.done
}

// lost reports whether h has lost its slot.
func lost(h *Holding) bool {
	select {
	case <-h.Lost():
		return true
	default:
		return false
	}
}

func debugOut() io.Writer {
	if os.Getenv("SLOTS_DEBUG") != "" {
		return os.Stderr
	}
	return io.Discard
}
