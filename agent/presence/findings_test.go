package presence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// startFollowing runs a watcher of rt over an event stream, and returns
// it, the stream, what it reports, and a channel that gets a token each
// time the watcher has subscribed.
func startFollowing(t *testing.T, rt *runtime, set []Image) (*Watcher, *events, gone, chan struct{}) {
	t.Helper()
	subscribed := make(chan struct{}, 10)
	ev := &events{names: make(chan string), fail: make(chan error), subscribed: subscribed}
	w, g := runOver(t, rt, ev, set)
	return w, ev, g, subscribed
}

// runOver runs a watcher of set over the stream ev until the test ends,
// and returns it, and what it reports, once it has subscribed (ev's
// subscribed channel must be set).
func runOver(t *testing.T, rt *runtime, ev *events, set []Image) (*Watcher, gone) {
	t.Helper()
	g := make(gone, 10)
	w := &Watcher{Runtime: rt, Events: ev, Log: discard, Gone: g.report}
	w.Watch(set)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-ev.subscribed
	return w, g
}

// noReport fails when something is reported within a short while.
func (g gone) noReport(t *testing.T) {
	t.Helper()
	select {
	case imgs := <-g:
		t.Errorf("reported gone: %v", imgs)
	case <-time.After(300 * time.Millisecond):
	}
}

// Issue 38, finding 1: an image removed while a check runs, before the
// check hands its set over, is reported once the set arrives.
func TestRemovalDuringACheckIsReported(t *testing.T) {
	rt := newRuntime()
	w, ev, g, _ := startFollowing(t, rt, []Image{b})
	// The check found a present; the kubelet removes it before the check
	// ends. The stream hands events over one by one: once the second is
	// taken, the first was handled.
	rt.set(a.Ref, "")
	ev.names <- a.Name
	ev.names <- "docker.io/library/unrelated:1"
	w.Watch([]Image{a, b})
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a", got)
	}
}

// Issue 38, finding 2: when the look after subscribing again fails
// (containerd still starting after a restart), it is tried again.
func TestFailedLookAfterResubscribeIsRetried(t *testing.T) {
	rt := newRuntime()
	_, ev, g, subscribed := startFollowing(t, rt, []Image{a})
	// containerd restarts, and comes back without a.
	rt.failAll(errors.New("connection refused"))
	rt.set(a.Ref, "")
	ev.fail <- errors.New("transport is closing")
	<-subscribed
	rt.waitFailed(t)
	rt.failAll(nil)
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a", got)
	}
}

// Issue 38, finding 3: an entry repo:tag@digest is recorded by containerd
// as repo@digest; deleting that record is a removal.
func TestDigestWithTagRemoved(t *testing.T) {
	pinned := Image{Name: "docker.io/library/c:1@sha256:ccc", Ref: "docker.io/library/c:1@sha256:ccc", ID: "sha256:c1"}
	rt := newRuntime()
	rt.set(pinned.Ref, pinned.ID)
	_, ev, g, _ := startFollowing(t, rt, []Image{pinned})
	rt.set(pinned.Ref, "")
	ev.names <- "docker.io/library/c@sha256:ccc"
	if got := g.next(t); !slices.Equal(got, []string{pinned.Name}) {
		t.Errorf("gone %v, want %s", got, pinned.Name)
	}
}

// Issue 38, finding 5: a tag that moved to another image deletes the old
// image's ID; the tag still resolves, so nothing is removed.
func TestMovedTagIsNoRemoval(t *testing.T) {
	rt := newRuntime()
	_, ev, g, _ := startFollowing(t, rt, []Image{a})
	rt.set(a.Ref, "sha256:newer")
	ev.names <- a.ID
	g.noReport(t)
}

// A deletion after the look that follows a subscription, before the
// runtime has registered the subscription, has no event: the look at
// settle finds it.
func TestDeletionBeforeTheSubscriptionCounts(t *testing.T) {
	rt := newRuntime()
	_, _, g, _ := startFollowing(t, rt, []Image{a, b})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, n := rt.calls(); n >= 2 {
			break // the first look asked about a and b
		}
		if time.Now().After(deadline) {
			t.Fatal("no look after subscribing")
		}
	}
	rt.set(a.Ref, "") // and no event
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a", got)
	}
}

// A deletion event reaches the agent and containerd's CRI plugin alike;
// an ImageStatus before the plugin has handled it still finds the image.
// The look 2 s after the event finds it gone.
func TestDeletionTheCRIPluginLearnsLate(t *testing.T) {
	rt := newRuntime()
	_, ev, g, _ := startFollowing(t, rt, []Image{a})
	waitStatuses(t, rt, 2) // the look after subscribing, and the one at settle
	ev.names <- a.Name     // the CRI plugin has not handled it yet
	waitStatuses(t, rt, 3)
	rt.set(a.Ref, "") // now it has
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a", got)
	}
}

// waitStatuses waits until rt has answered n ImageStatus calls.
func waitStatuses(t *testing.T, rt *runtime, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		_, got := rt.calls()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ImageStatus calls within 5 s, want %d", got, n)
		}
	}
}

// Issue 48, finding 6: a deletion is noticed even when containerd's CRI
// plugin learns of it 10 s after the event (a loaded node). Before, the
// event got two looks, at once and 2 s later, and the removal went unseen
// until the next check. Real time: the schedule itself is under test.
func TestDeletionTheCRIPluginLearns10sLate(t *testing.T) {
	t.Parallel()
	rt := newRuntime()
	_, ev, g, _ := startFollowing(t, rt, []Image{a})
	waitStatuses(t, rt, 2) // the look after subscribing, and the one at settle
	ev.names <- a.Name
	learnt := time.AfterFunc(10*time.Second, func() { rt.set(a.Ref, "") })
	defer learnt.Stop()
	select {
	case imgs := <-g:
		if len(imgs) != 1 || imgs[0].Name != a.Name {
			t.Errorf("gone %v, want a", imgs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a deletion the CRI plugin learnt of 10 s late was not noticed within 20 s")
	}
}

// Issue 48, finding 8: a deletion of an image nobody watches costs no
// ImageStatus call, and one of a watched image asks about that image only.
// Before, each deletion asked about every watched image: the 40 deletions
// here cost 800 calls, and the watched one 1,000.
func TestUnwatchedDeletionCostsNoLook(t *testing.T) {
	rt := newRuntime()
	set := []Image{a}
	for i := range 199 {
		ref := fmt.Sprintf("docker.io/library/img%d:1", i)
		rt.set(ref, fmt.Sprintf("sha256:%064d", i))
		set = append(set, Image{Name: ref, Ref: ref, ID: fmt.Sprintf("sha256:%064d", i)})
	}
	_, ev, g, _ := startFollowing(t, rt, set)
	waitStatuses(t, rt, 2*len(set)) // the looks after subscribing
	_, before := rt.calls()
	for i := range 20 {
		ev.names <- fmt.Sprintf("docker.io/other/unrelated%d:1", i)
		ev.names <- fmt.Sprintf("sha256:%064x", 1000+i)
	}
	g.noReport(t)
	if _, after := rt.calls(); after != before {
		t.Errorf("%d ImageStatus calls for 40 deletions of unwatched records, want 0", after-before)
	}
	rt.set(a.Ref, "")
	ev.names <- a.ID // the kubelet's GC deletes by ID
	if got := g.next(t); !slices.Equal(got, []string{a.Name}) {
		t.Errorf("gone %v, want a", got)
	}
	if _, after := rt.calls(); after-before != 1 {
		t.Errorf("%d ImageStatus calls for the deletion of a watched image, want 1", after-before)
	}
}

// A late look after a deletion event that runs while the event stream is
// broken (the runtime restarting, wiped) reports what it finds gone as
// gone with the restart, not as a removal by the kubelet's GC. Before, it
// was reported as one, and held back as one the GC keeps removing
// (tests/runtimes TestRemovalNoticed, the wipe).
func TestLateLookWhileTheStreamIsDown(t *testing.T) {
	rt := newRuntime()
	_, ev, g := startGated(t, rt, a)
	waitStatuses(t, rt, 2)
	ev.names <- b.Name // a deletion of another image: no look at a
	ev.names <- a.Name // a deletion event for a that the CRI plugin has not handled
	// Its look at once finds a present, before the runtime goes away: a
	// look racing the break could find it wiped before the watcher knows
	// of the break, which no real runtime answers (it is down).
	waitStatuses(t, rt, 3)
	ev.fail <- errors.New("transport is closing")
	rt.set(a.Ref, "") // the runtime comes back wiped; not subscribed yet
	select {
	case imgs := <-g:
		if len(imgs) != 1 || imgs[0].Name != a.Name || !imgs[0].AfterRestart {
			t.Errorf("gone %+v, want a, gone with the restart", imgs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a not reported")
	}
}

// A look that succeeds while the event stream is down does not end the
// restart: a runtime shutting down may still answer before it stops and
// is wiped, and what the next look finds gone went with the wipe. Before,
// that look ended it, and the late look after an earlier deletion
// reported the wiped image as removed by the kubelet's GC (tests/runtimes
// TestRemovalNoticed on containerd 1.6, the wipe a second after a repair).
func TestLookBeforeTheRuntimeStops(t *testing.T) {
	rt := newRuntime()
	w, ev, g := startGated(t, rt, a)
	waitStatuses(t, rt, 2)
	ev.names <- a.Name // late looks at a follow, for 12 s
	waitStatuses(t, rt, 3)
	ev.fail <- errors.New("error reading from server: EOF")
	for deadline := time.Now().Add(5 * time.Second); !w.broken(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the break not taken in within 5 s")
		}
	}
	// The repair's check watches a again: its look finds a present, on a
	// runtime that has closed its stream but still answers.
	w.Watch([]Image{a})
	waitStatuses(t, rt, 4)
	rt.set(a.Ref, "") // stopped, wiped, started; not subscribed yet
	select {
	case imgs := <-g:
		if len(imgs) != 1 || imgs[0].Name != a.Name || !imgs[0].AfterRestart {
			t.Errorf("gone %+v, want a, gone with the restart", imgs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a not reported")
	}
}

// broken reports whether the watcher has taken in a break of the stream.
func (w *Watcher) broken() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.restarted
}

// startGated runs a watcher of img over an event stream whose
// subscriptions after the first wait for ev.gate (a runtime restarting),
// until the test ends, and returns it once it has subscribed.
func startGated(t *testing.T, rt *runtime, img Image) (*Watcher, *events, gone) {
	t.Helper()
	ev := &events{names: make(chan string), fail: make(chan error), subscribed: make(chan struct{}, 10), gate: make(chan struct{})}
	w, g := runOver(t, rt, ev, []Image{img})
	return w, ev, g
}
