package slots

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const testNS = "prefetch"

var leasesGVR = coordinationv1.SchemeGroupVersion.WithResource("leases")

// fakeAPI is client-go's fake clientset plus what it lacks and the real
// apiserver has: resourceVersions that change on every write, and
// conflicts for updates that carry a stale one. A hook can fail or
// interfere with calls.
type fakeAPI struct {
	cs *fake.Clientset

	mu   sync.Mutex
	rv   int64
	hook func(verb, name string, lease *coordinationv1.Lease) error
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{cs: fake.NewSimpleClientset()}
	f.cs.PrependReactor("*", "leases", f.react)
	return f
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
	}
	if hook != nil {
		if err := hook(action.GetVerb(), name, lease); err != nil {
			return true, nil, err
		}
	}
	tr := f.cs.Tracker()
	switch action.GetVerb() {
	case "create":
		if _, err := tr.Get(leasesGVR, testNS, name); err == nil {
			return true, nil, apierrors.NewAlreadyExists(leasesGVR.GroupResource(), name)
		}
		lease.ResourceVersion = f.nextRV()
		return true, lease, tr.Create(leasesGVR, lease, testNS)
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
		return true, lease, tr.Update(leasesGVR, lease, testNS)
	}
	return false, nil, nil
}

type errorString string

func (e errorString) Error() string { return string(e) }

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
		if _, err := f.cs.CoordinationV1().Leases(testNS).Create(context.Background(), cur, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return
	}
	next := cur.DeepCopy()
	change(next)
	if _, err := f.cs.CoordinationV1().Leases(testNS).Update(context.Background(), next, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s: %v", name, err)
	}
}

// sneak changes a Lease directly in the tracker, bumping its
// resourceVersion. Hooks use it: they run inside the fake's lock, where a
// call through the clientset would deadlock.
func (f *fakeAPI) sneak(t *testing.T, name string, change func(*coordinationv1.Lease)) {
	t.Helper()
	next := f.lease(t, name).DeepCopy()
	change(next)
	next.ResourceVersion = f.nextRV()
	if err := f.cs.Tracker().Update(leasesGVR, next, testNS); err != nil {
		t.Errorf("update %s: %v", name, err)
	}
}

// gate builds a Gate on the fake. Durations below a second are allowed
// here (New rounds them up for the API; tests set them afterwards) so
// that expiry tests run fast; the Lease then says 0 seconds and readers
// fall back to the configured duration.
func (f *fakeAPI) gate(t *testing.T, cfg Config, leaseDuration time.Duration) *Gate {
	t.Helper()
	cfg.Client = f.cs.CoordinationV1().Leases(testNS)
	cfg.Namespace = testNS
	if cfg.Instance == "" {
		cfg.Instance = "demo"
	}
	if cfg.Identity == "" {
		cfg.Identity = "pod"
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if leaseDuration > 0 {
		g.cfg.LeaseDuration = leaseDuration
	}
	return g
}

func hold(t *testing.T, g *Gate) *Holding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
