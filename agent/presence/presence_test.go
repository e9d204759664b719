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
	// err fails every call while set; failed gets a token per failure.
	err    error
	failed chan struct{}
}

func (r *runtime) failAll(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
	if r.failed == nil {
		r.failed = make(chan struct{}, 100)
	}
}

// fail returns the error every call fails with now; r.mu is held.
func (r *runtime) fail() error {
	if r.err != nil {
		select {
		case r.failed <- struct{}{}:
		default:
		}
	}
	return r.err
}

// waitFailed waits for a call failed by failAll.
func (r *runtime) waitFailed(t *testing.T) {
	t.Helper()
	select {
	case <-r.failed:
	case <-time.After(5 * time.Second):
		t.Fatal("no call failed")
	}
}

func (r *runtime) ListImages(context.Context) ([]cri.ListedImage, error) {
	r.mu.Lock()
	r.lists++
	var ids []cri.ListedImage
	for ref, id := range r.images {
		ids = append(ids, cri.ListedImage{ID: id, Names: []string{ref}})
	}
	err := r.listErr
	if f := r.fail(); f != nil {
		err = f
	}
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
	if err := r.fail(); err != nil {
		return nil, err
	}
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

// look asks ImageStatus for each watched image, by its reference.
func TestLook(t *testing.T) {
	tests := []struct {
		name string
		// change is applied to the runtime before the look.
		change   func(r *runtime)
		wantGone []string
		wantErr  bool
		// wantA: a is still watched afterwards.
		wantA bool
	}{
		{name: "all there", change: func(*runtime) {}, wantA: true},
		{name: "removed", change: func(r *runtime) { r.set(a.Ref, "") }, wantGone: []string{a.Name}},
		{name: "retagged to a newer image: not gone", change: func(r *runtime) { r.set(a.Ref, "sha256:new") }, wantA: true},
		{name: "both removed", change: func(r *runtime) { r.set(a.Ref, ""); r.set(b.Ref, "") }, wantGone: []string{a.Name, b.Name}},
		{name: "the runtime fails: nothing reported", change: func(r *runtime) { r.set(a.Ref, ""); r.failAll(errors.New("unavailable")) }, wantErr: true, wantA: true},
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
			w.trigger() // as a subscription does: a look at the whole set
			tt.change(rt)
			if err := w.look(context.Background()); (err != nil) != tt.wantErr {
				t.Errorf("look: %v, want an error %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.wantGone) {
				t.Errorf("gone %v, want %v", got, tt.wantGone)
			}
			if lists, statuses := rt.calls(); lists != 0 || statuses != 2 {
				t.Errorf("%d ListImages and %d ImageStatus calls, want 0 and 2", lists, statuses)
			}
			if watched := slices.ContainsFunc(w.set, func(img Image) bool { return img.Name == a.Name }); watched != tt.wantA {
				t.Errorf("a watched %v, want %v", watched, tt.wantA)
			}
			// What was reported is not reported again.
			got = nil
			w.trigger()
			_ = w.look(context.Background())
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
	// subscribed, when set, gets a token after each subscription.
	subscribed chan struct{}
	// gate, when set, holds each subscription after the first until it
	// gets a token: a runtime still restarting.
	gate chan struct{}
	mu   sync.Mutex
}

func (e *events) WatchImageDeletes(ctx context.Context, subscribed func(), deleted func(string)) error {
	e.mu.Lock()
	e.subscribes++
	again := e.subscribes > 1
	e.mu.Unlock()
	if again && e.gate != nil {
		select {
		case <-e.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	subscribed()
	if e.unsupported {
		// As CRI-O: the stream opens, then its first read is refused.
		return fmt.Errorf("%w: unknown service", cri.ErrNoEvents)
	}
	if e.subscribed != nil {
		e.subscribed <- struct{}{}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-e.fail:
			return err
		case name := <-e.names:
			deleted(name)
		}
	}
}

// With an event stream, a deletion makes the watcher ask ImageStatus about
// the set, and nothing is asked while nothing is deleted.
func TestEvents(t *testing.T) {
	rt := newRuntime()
	w, ev, g, subscribed := startFollowing(t, rt, []Image{a, b})
	rt.set(a.Ref, "")
	ev.names <- a.Name
	if imgs := <-g; len(imgs) != 1 || imgs[0].Name != a.Name || imgs[0].AfterRestart {
		t.Errorf("gone %+v, want a, on an event", imgs)
	}
	// A broken stream is subscribed again, with a look for what happened
	// meanwhile (a runtime wiped while it was down).
	_, before := rt.calls()
	w.Watch([]Image{b}) // asks about b once: a was deleted since the last Watch
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, n := rt.calls(); n > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Watch after a deletion did not ask about the new set")
		}
		time.Sleep(time.Millisecond)
	}
	ev.fail <- errors.New("transport is closing")
	rt.set(b.Ref, "")
	<-subscribed
	select {
	case imgs := <-g:
		if len(imgs) != 1 || imgs[0].Name != b.Name || !imgs[0].AfterRestart {
			t.Errorf("gone %+v, want b, found by the look after subscribing again (AfterRestart)", imgs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b not reported after subscribing again")
	}
	if lists, _ := rt.calls(); lists != 0 {
		t.Errorf("%d ListImages calls, want none: events say when to look", lists)
	}
}

// A runtime without events (CRI-O) is listed every interval; a change of
// the list makes the watcher ask ImageStatus.
func TestPollWithoutEvents(t *testing.T) {
	rt := newRuntime()
	rt.listed = make(chan struct{}, 100)
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

// CRI-O opens the event stream before refusing it. That opening asks no
// look of the first Watch: the listings notice what the check missed, and
// the look was an idle call that tests/runtimes counted against CRI-O.
func TestRefusedStreamOwesNoLook(t *testing.T) {
	rt := newRuntime()
	w := &Watcher{Runtime: rt, Events: &events{unsupported: true}, Log: discard, Gone: func([]Image) {}}
	ctx := context.Background()
	if w.follow(ctx) {
		t.Fatal("follow went on after the stream was refused")
	}
	// The look the opening asked for: nothing is watched yet.
	if err := w.look(ctx); err != nil {
		t.Fatal(err)
	}
	w.Watch([]Image{a, b}) // the first check's results
	if err := w.look(ctx); err != nil {
		t.Fatal(err)
	}
	if lists, statuses := rt.calls(); lists+statuses != 0 {
		t.Errorf("%d ListImages and %d ImageStatus calls after the refusal, want none until the next listing", lists, statuses)
	}
}

// The cost where there is no event stream: one ListImages per interval,
// nothing else while the list does not change. At DefaultInterval, 6 a minute.
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
		w.poll(context.Background())
	}
	lists, statuses := rt.calls()
	perMinute := float64(lists+statuses) / float64(b.N) * float64(time.Minute/DefaultInterval)
	b.ReportMetric(perMinute, "CRI-calls/min")
}

// Where there is no event stream, only a watched image's ID missing from
// the list asks for a look (ImageStatus calls): not images the list gains,
// as a check's own pulls add them, and a moved tag only once.
func TestPollLooksOnlyWhenAWatchedIDIsMissing(t *testing.T) {
	tests := []struct {
		name      string
		change    func(*runtime)
		wantLooks []bool // per poll: whether it asked for a look
	}{
		{name: "idle", change: func(*runtime) {}, wantLooks: []bool{false, false}},
		{name: "the list gains an image", change: func(r *runtime) { r.set("docker.io/library/c:1", "sha256:ccc") }, wantLooks: []bool{false, false}},
		{name: "a watched image removed", change: func(r *runtime) { r.set(a.Ref, "") }, wantLooks: []bool{true}},
		{name: "a watched tag moved", change: func(r *runtime) { r.set(a.Ref, "sha256:new") }, wantLooks: []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newRuntime()
			var gone []Image
			w := &Watcher{Runtime: rt, Log: discard, Gone: func(imgs []Image) { gone = append(gone, imgs...) }}
			w.Watch([]Image{a, b})
			tt.change(rt)
			for i, want := range tt.wantLooks {
				w.poll(context.Background())
				asked := false
				select {
				case <-w.wakeup():
					asked = true
					if err := w.look(context.Background()); err != nil {
						t.Fatal(err)
					}
				default:
				}
				if asked != want {
					t.Errorf("poll %d asked for a look: %v, want %v", i+1, asked, want)
				}
			}
			if tt.name == "a watched image removed" && (len(gone) != 1 || gone[0].Name != a.Name) {
				t.Errorf("gone %v, want a", gone)
			}
			if tt.name != "a watched image removed" && len(gone) != 0 {
				t.Errorf("gone %v, want nothing", gone)
			}
		})
	}
}
