// Package presence notices within seconds when an image the agent found
// present leaves the node: the kubelet's image GC, `crictl rmi`, a wiped
// runtime. Between two checks the label would otherwise say `succeeded`
// for an image that is gone, for up to the whole refresh interval.
//
// It asks the kubelet's question: does ImageStatus for the reference the
// pods use find an image? Anything else is only a reason to ask now. On
// containerd that reason is an image deletion on the event stream (CRI
// socket, namespace k8s.io): no call at all while nothing is deleted. On
// CRI-O, which has no stream, it is a watched image's ID missing from the
// runtime's image list, listed every Interval (10 s: 6 calls a minute while
// idle, and no look after a check's own pulls add images).
package presence

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// DefaultInterval is how often the images are listed where the runtime
// has no event stream: a removal is then noticed within 10 s, and the
// label written well within 15 s, at 6 CRI calls a minute.
const DefaultInterval = 10 * time.Second

// callTimeout bounds each runtime call: a stuck runtime must not stop the
// watch for good.
const callTimeout = 10 * time.Second

// settle is when a subscription looks a second time. containerd registers
// a subscription some time after its stream opens and says nothing when,
// so a deletion between the first look and then has no event: on a loaded
// node, an image deleted 0.19 s after the agent started watching went
// unseen until the next check, 10 min later (tests/disk).
const settle = 2 * time.Second

// lateLooks are when an image a deletion event names is looked at again,
// after the look at once, until it is found gone. containerd's CRI plugin
// learns of a deletion from the same events, and until it has, ImageStatus
// still finds the image: on a loaded node that took more than 2 s. The
// last look, 12 s after the event, covers a plugin 10 s late.
var lateLooks = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 12 * time.Second}

// maxDeleted bounds the names of deleted records kept between two checks;
// past it, the next set is looked at whole.
const maxDeleted = 1000

// maxRetry is the longest wait before a failed look is tried again.
const maxRetry = 10 * time.Second

// Image is one image found present.
type Image struct {
	// Name is the fully qualified reference (docker.io/library/busybox:1.36).
	Name string
	// Ref is what CRI calls ask for (the kubelet's reference).
	Ref string
	// ID is the image ID the runtime reported.
	ID string
	// AfterRestart: found gone by the look after the event stream came
	// back, so removed while the runtime was down (a wipe), not by the
	// kubelet's image GC, which needs a running runtime.
	AfterRestart bool
}

// Runtime is the part of the CRI the watcher needs.
type Runtime interface {
	ListImages(ctx context.Context) ([]cri.ListedImage, error)
	ImageStatus(ctx context.Context, ref string) (*cri.ImageInfo, error)
}

// Events is containerd's event stream (cri.Client.WatchImageDeletes). It
// returns an error wrapping cri.ErrNoEvents when the runtime has none.
type Events interface {
	WatchImageDeletes(ctx context.Context, subscribed func(), deleted func(name string)) error
}

// Watcher watches a set of images.
type Watcher struct {
	Runtime Runtime
	// Events, when set, is followed instead of listing every Interval.
	Events Events
	// Interval is DefaultInterval when zero.
	Interval time.Duration
	Log      *slog.Logger
	// Gone is called with the images found gone, from Run's goroutines.
	// They leave the set: Watch sets it again.
	Gone func([]Image)

	once sync.Once
	wake chan struct{}

	// late is lateLooks when nil.
	late []time.Duration

	mu  sync.Mutex
	set []Image
	// changed: something may have been removed since the last Watch. The
	// looks since then asked about the old set; the new one is asked
	// about at once (a removal during a check). deletedSince are the
	// records deletion events named since then: of the new set, only the
	// images they may be are asked about.
	changed      bool
	deletedSince []string
	// all asks the next look about the whole set; wanted, about these
	// images only (by Name).
	all    bool
	wanted map[string]bool
	// restarted: the stream broke, and no look begun since it came back
	// has succeeded. down: it is broken now. breaks counts the breaks, so
	// that a look the stream broke under clears nothing. A look while
	// the stream is down may find a runtime still shutting down that
	// answers, and the wipe follows (tests/runtimes TestRemovalNoticed).
	restarted, down bool
	breaks          int
}

func (w *Watcher) wakeup() chan struct{} {
	w.once.Do(func() { w.wake = make(chan struct{}, 1) })
	return w.wake
}

// Watch replaces the set of images to watch: what the last check found
// present.
func (w *Watcher) Watch(set []Image) {
	w.mu.Lock()
	w.set = slices.Clone(set)
	changed := w.changed
	var named []string
	for _, img := range w.set {
		if slices.ContainsFunc(w.deletedSince, img.named) {
			named = append(named, img.Name)
		}
	}
	w.changed, w.deletedSince = false, nil
	w.all = w.all || changed
	w.mu.Unlock()
	if changed {
		w.poke()
	}
	w.suspect(named)
}

// deleted handles a deletion event naming record name: the watched images
// it may be are looked at, at once and at lateLooks. A name that is none
// of them costs no call. One that cannot be read asks about the whole set.
func (w *Watcher) deleted(name string) {
	if name == "" {
		w.trigger()
		return
	}
	w.mu.Lock()
	if len(w.deletedSince) < maxDeleted {
		w.deletedSince = append(w.deletedSince, name)
	} else {
		w.changed = true
	}
	var named []string
	for _, img := range w.set {
		if img.named(name) {
			named = append(named, img.Name)
		}
	}
	w.mu.Unlock()
	w.suspect(named)
}

// suspect asks about the images of the set called names, at once and
// again at each of the late looks while they are still watched: a look
// that finds one gone takes it out of the set.
func (w *Watcher) suspect(names []string) {
	if len(names) == 0 {
		return
	}
	w.ask(names)
	late := w.late
	if late == nil {
		late = lateLooks
	}
	for _, d := range late {
		time.AfterFunc(d, func() { w.ask(names) })
	}
}

// ask asks the next look about those of names still watched.
func (w *Watcher) ask(names []string) {
	w.mu.Lock()
	n := 0
	for _, name := range names {
		if slices.ContainsFunc(w.set, func(img Image) bool { return img.Name == name }) {
			if w.wanted == nil {
				w.wanted = map[string]bool{}
			}
			w.wanted[name] = true
			n++
		}
	}
	w.mu.Unlock()
	if n > 0 {
		w.poke()
	}
}

// trigger records that something may have been removed, and asks for a
// look at the whole set.
func (w *Watcher) trigger() {
	w.mu.Lock()
	w.changed, w.all = true, true
	w.mu.Unlock()
	w.poke()
}

// named reports whether the image record called name may be img's: its
// reference, its ID, or another reference of its repository (containerd
// records a repo:tag@digest reference as repo@digest).
func (img Image) named(name string) bool {
	if name == img.Name || name == img.Ref || name == img.ID {
		return true
	}
	if !strings.Contains(name, "/") {
		return false // an image ID, or a name no reference has
	}
	repo := repository(name)
	return repo == repository(img.Name) || repo == repository(img.Ref)
}

// repository is a reference without its tag and digest.
func repository(ref string) string {
	if at := strings.IndexByte(ref, '@'); at >= 0 {
		ref = ref[:at]
	}
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		ref = ref[:i]
	}
	return ref
}

func (w *Watcher) poke() {
	select {
	case w.wakeup() <- struct{}{}:
	default:
	}
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.looker(ctx) })
	if w.Events != nil && w.follow(ctx) {
		return
	}
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	w.poll(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.poll(ctx)
		}
	}
}

// looker looks whenever asked to, and again, backing off, while a look
// fails: a runtime still starting after a restart is asked until it
// answers.
func (w *Watcher) looker(ctx context.Context) {
	const firstRetry = time.Second
	retry := firstRetry
	var again <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wakeup():
		case <-again:
		}
		again = nil
		if err := w.look(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			w.Log.Warn("cannot tell whether the watched images are still present; asking again", "retryIn", retry, "err", err)
			again = time.After(retry)
			retry = min(2*retry, maxRetry)
			continue
		}
		retry = firstRetry
	}
}

// follow reads the event stream, subscribing again whenever it breaks. It
// returns false at once when the runtime has no stream.
func (w *Watcher) follow(ctx context.Context) bool {
	const maxWait = 10 * time.Second
	wait := time.Second
	subscribed := w.trigger
	for {
		start := time.Now()
		// Each subscription looks at once: what happened while the stream
		// was down (a runtime wiped while stopped) has no event.
		first, late := subscribed, (*time.Timer)(nil)
		err := w.Events.WatchImageDeletes(ctx, func() {
			first()
			late = time.AfterFunc(settle, w.trigger)
		}, w.deleted)
		if late != nil {
			late.Stop() // CRI-O opens the stream, then answers Unimplemented
		}
		subscribed = func() {
			w.mu.Lock()
			w.restarted, w.down = true, false
			w.mu.Unlock()
			w.trigger()
		}
		if errors.Is(err, cri.ErrNoEvents) {
			// CRI-O opens the stream and only then refuses it. The look
			// the opening asked for is not owed at the next Watch:
			// listing notices a watched image that left meanwhile.
			w.mu.Lock()
			w.changed = false
			w.mu.Unlock()
			w.Log.Info("the runtime has no image event stream: listing its images every interval to notice removals", "interval", w.Interval, "err", err)
			return false
		}
		if ctx.Err() != nil {
			return true
		}
		if time.Since(start) > maxWait {
			wait = time.Second
		}
		// The runtime went away (a restart, perhaps after a wipe): what a
		// look finds gone from now on, until one after the stream is back
		// succeeds, went with it, not with the kubelet's image GC. A late
		// look after an earlier deletion event runs meanwhile.
		w.mu.Lock()
		w.restarted, w.down = true, true
		w.breaks++
		w.mu.Unlock()
		w.Log.Warn("the runtime's image event stream broke; subscribing again", "retryIn", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return true
		case <-t.C:
		}
		wait = min(2*wait, maxWait)
	}
}

// poll lists the runtime's images, and asks for a look when the ID of a
// watched image is no longer listed: the kubelet's GC and a wipe remove
// images by ID, and a moved tag drops the old ID (the look then finds the
// new one). Images the list gains, as a check's own pulls add them, cost
// nothing. An untag that leaves the image under another name is found by
// the next check. A failed listing is tried at the next tick.
func (w *Watcher) poll(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, callTimeout)
	list, err := w.Runtime.ListImages(lctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.Log.Warn("cannot list the runtime's images to notice removals; trying again", "err", err)
		}
		return
	}
	listed := make(map[string]bool, len(list))
	for _, img := range list {
		listed[img.ID] = true
	}
	w.mu.Lock()
	missing := slices.ContainsFunc(w.set, func(img Image) bool { return !listed[img.ID] })
	w.mu.Unlock()
	if missing {
		w.trigger()
	}
}

// look asks ImageStatus, by the reference the pods use, about the images
// asked about (the whole set after a subscription or a listing, the
// images a deletion event named otherwise), and reports those it does not
// find. An image the reference now finds under another ID (a tag moved to
// a newer image) is present. It returns the first error; the images it
// could not ask about are asked about again.
func (w *Watcher) look(ctx context.Context) error {
	w.mu.Lock()
	all, wanted := w.all, w.wanted
	w.all, w.wanted = false, nil
	var set []Image
	for _, img := range w.set {
		if all || wanted[img.Name] {
			set = append(set, img)
		}
	}
	restarted := w.restarted
	settles := restarted && !w.down
	breaks := w.breaks
	w.mu.Unlock()
	gone := map[string]bool{}
	moved := map[string]string{}
	var first error
	var failed []string
	for _, img := range set {
		sctx, cancel := context.WithTimeout(ctx, callTimeout)
		info, err := w.Runtime.ImageStatus(sctx, img.Ref)
		cancel()
		switch {
		case err != nil:
			first = cmp.Or(first, err)
			failed = append(failed, img.Name)
		case info == nil:
			gone[img.Name] = true
		case info.ID != img.ID:
			moved[img.Name] = info.ID
		}
	}
	// The reference now finds another image: watch that one, so that the
	// old ID missing from the list asks for no more looks.
	w.mu.Lock()
	for i, img := range w.set {
		if id, ok := moved[img.Name]; ok {
			w.set[i].ID = id
		}
	}
	if first == nil && settles && breaks == w.breaks {
		w.restarted = false
	}
	for _, name := range failed {
		if w.wanted == nil {
			w.wanted = map[string]bool{}
		}
		w.wanted[name] = true
	}
	w.mu.Unlock()
	w.report(func(img Image) bool { return gone[img.Name] }, restarted)
	return first
}

// report takes the images matched by gone out of the set and calls Gone
// with them.
func (w *Watcher) report(gone func(Image) bool, afterRestart bool) {
	w.mu.Lock()
	var out []Image
	w.set = slices.DeleteFunc(w.set, func(img Image) bool {
		if gone(img) {
			img.AfterRestart = afterRestart
			out = append(out, img)
			return true
		}
		return false
	})
	w.mu.Unlock()
	if len(out) > 0 {
		w.Gone(out)
	}
}
