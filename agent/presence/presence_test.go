package presence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

var discard = slog.New(slog.DiscardHandler)

// runtime is a CRI in memory: images by reference, with their IDs. It
// counts the calls, which are the watch's cost.
type runtime struct {
	mu       sync.Mutex
	images   map[string]string // reference -> ID
	lists    int
	statuses int
	listErr  error
	// listed, when set, gets a token after each ListImages call.
	listed chan struct{}
}

func (r *runtime) ListImages(context.Context) ([]string, error) {
	r.mu.Lock()
	r.lists++
	var ids []string
	for _, id := range r.images {
		ids = append(ids, id)
	}
	err := r.listErr
	r.mu.Unlock()
	if r.listed != nil {
		r.listed <- struct{}{}
	}
	return ids, err
}

func (r *runtime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses++
	if id, ok := r.images[ref]; ok {
		return &cri.ImageInfo{ID: id}, nil
	}
	return nil, nil
}

func (r *runtime) set(ref, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id == "" {
		delete(r.images, ref)
		return
	}
	r.images[ref] = id
}

func (r *runtime) calls() (lists, statuses int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists, r.statuses
}

var (
	a = Image{Name: "docker.io/library/a:1", Ref: "docker.io/library/a:1", ID: "sha256:aaa"}
	b = Image{Name: "docker.io/library/b:1", Ref: "docker.io/library/b:1", ID: "sha256:bbb"}
)

func newRuntime() *runtime {
	return &runtime{images: map[string]string{a.Ref: a.ID, b.Ref: b.ID}}
}

// gone collects what a watcher reports.
type gone chan []Image

func (g gone) report(imgs []Image) { g <- imgs }

func (g gone) next(t *testing.T) []string {
	t.Helper()
	select {
	case imgs := <-g:
		var names []string
		for _, img := range imgs {
			names = append(names, img.Name)
		}
		return names
	case <-time.After(5 * time.Second):
		t.Fatal("no removal reported")
		return nil
	}
}

// look is what the poll does each interval, called directly.
func TestLook(t *testing.T) {
	tests := []struct {
		name string
		// change is applied to the runtime before the look.
		change       func(r *runtime)
		wantGone     []string
		wantStatuses int
		wantID       string // a's ID in the set afterwards
	}{
		{name: "all there: one call", change: func(*runtime) {}, wantID: a.ID},
		{name: "removed", change: func(r *runtime) { r.set(a.Ref, "") }, wantGone: []string{a.Name}, wantStatuses: 1},
		{name: "retagged to a newer image: not gone", change: func(r *runtime) { r.set(a.Ref, "sha256:new") }, wantStatuses: 1, wantID: "sha256:new"},
		{name: "both removed", change: func(r *runtime) { r.set(a.Ref, ""); r.set(b.Ref, "") }, wantGone: []string{a.Name, b.Name}, wantStatuses: 2},
		{name: "listing fails: nothing reported", change: func(r *runtime) { r.set(a.Ref, ""); r.listErr = errors.New("unavailable") }, wantID: a.ID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newRuntime()
			var got []string
			w := &Watcher{Runtime: rt, Log: discard, Gone: func(imgs []Image) {
				for _, img := range imgs {
					got = append(got, img.Name)
				}
			}}
			w.Watch([]Image{a, b})
			tt.change(rt)
			w.look(context.Background())
			if !slices.Equal(got, tt.wantGone) {
				t.Errorf("gone %v, want %v", got, tt.wantGone)
			}
			if lists, statuses := rt.calls(); lists != 1 || statuses != tt.wantStatuses {
				t.Errorf("%d ListImages and %d ImageStatus calls, want 1 and %d", lists, statuses, tt.wantStatuses)
			}
			idx := slices.IndexFunc(w.set, func(img Image) bool { return img.Name == a.Name })
			if tt.wantID == "" {
				if idx >= 0 {
					t.Errorf("a is still watched after it was reported gone")
				}
			} else if idx < 0 || w.set[idx].ID != tt.wantID {
				t.Errorf("set %v, want a with ID %s", w.set, tt.wantID)
			}
			// What was reported is not reported again.
			got = nil
			w.look(context.Background())
			if len(got) != 0 {
				t.Errorf("reported again: %v", got)
			}
		})
	}
}

func TestEmptySetCostsNothing(t *testing.T) {
	rt := newRuntime()
	w := &Watcher{Runtime: rt, Log: discard, Gone: func([]Image) { t.Error("nothing is watched") }}
	w.look(context.Background())
	if lists, statuses := rt.calls(); lists+statuses != 0 {
		t.Errorf("%d calls with nothing to watch", lists+statuses)
	}
}

// events is a containerd event stream in memory.
type events struct {
	names chan string
	// fail ends the stream with this error, once per value.
	fail        chan error
	subscribes  int
	unsupported bool
	mu          sync.Mutex
}

func (e *events) WatchImageDeletes(ctx context.Context, subscribed func(), deleted func(string)) error {
	e.mu.Lock()
	e.subscribes++
	e.mu.Unlock()
	if e.unsupported {
		return fmt.Errorf("%w: unknown service", cri.ErrNoEvents)
	}
	subscribed()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-e.fail:
			return err
		case n := <-e.names:
			deleted(n)
		}
	}
}

// With an event stream, a deletion is reported as the event comes, by any
// name the image is known by, and nothing is listed while nothing happens.
func TestEvents(t *testing.T) {
	rt := newRuntime()
	rt.listed = make(chan struct{}, 10)
	ev := &events{names: make(chan string), fail: make(chan error)}
	g := make(gone, 10)
	w := &Watcher{Runtime: rt, Events: ev, Interval: time.Millisecond, Log: discard, Gone: g.report}
	w.Watch([]Image{a, b})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	<-rt.listed // the look when subscribed
	ev.names <- "docker.io/library/other:1"
	ev.names <- a.Name
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a", got)
	}
	ev.names <- b.ID
	if got := g.next(t); !slices.Equal(got, []string{b.Name}) {
		t.Errorf("gone %v, want b (deleted by ID)", got)
	}
	// A broken stream is subscribed again, with a look for what happened
	// meanwhile (a runtime wiped while it was down).
	w.Watch([]Image{a})
	rt.set(a.Ref, "")
	ev.fail <- errors.New("transport is closing")
	<-rt.listed
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a, found by the look after subscribing again", got)
	}
	cancel()
	<-done
	if lists, _ := rt.calls(); lists != 2 {
		t.Errorf("%d ListImages calls, want 2: one per subscription, none while events flow", lists)
	}
}

// A runtime without events (CRI-O) is listed every interval.
func TestPollWithoutEvents(t *testing.T) {
	rt := newRuntime()
	rt.listed = make(chan struct{}, 10)
	ev := &events{unsupported: true}
	g := make(gone, 10)
	w := &Watcher{Runtime: rt, Events: ev, Interval: time.Millisecond, Log: discard, Gone: g.report}
	w.Watch([]Image{a, b})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	<-rt.listed
	rt.set(b.Ref, "")
	if got := g.next(t); !slices.Equal(got, []string{b.Name}) {
		t.Errorf("gone %v, want b", got)
	}
	if ev.subscribes != 1 {
		t.Errorf("subscribed %d times to a runtime without events, want once", ev.subscribes)
	}
}

// The cost where there is no event stream: one ListImages per interval,
// nothing else while nothing is removed. At DefaultInterval, 6 a minute.
func BenchmarkPollCost(b *testing.B) {
	rt := newRuntime()
	w := &Watcher{Runtime: rt, Log: discard, Gone: func([]Image) {}}
	set := []Image{a}
	for i := range 100 {
		ref := fmt.Sprintf("docker.io/library/img%d:1", i)
		rt.set(ref, "sha256:"+ref)
		set = append(set, Image{Name: ref, Ref: ref, ID: "sha256:" + ref})
	}
	w.Watch(set)
	for b.Loop() {
		w.look(context.Background())
	}
	lists, statuses := rt.calls()
	perMinute := float64(lists+statuses) / float64(b.N) * float64(time.Minute/DefaultInterval)
	b.ReportMetric(perMinute, "CRI-calls/min")
}
