// Package presence notices within seconds when an image the agent found
// present leaves the node: the kubelet's image GC, `crictl rmi`, a wiped
// runtime. Between two checks the label would otherwise say `succeeded`
// for an image that is gone, for up to the whole refresh interval.
//
// It costs the runtime little. On containerd it follows the event stream
// on the CRI socket (image deletions in namespace k8s.io): no call at all
// while nothing happens, and one ListImages when the stream (re)connects,
// to catch what happened while it was down (a runtime wiped while
// stopped). CRI-O serves no such stream: there it lists the images every
// Interval (10 s: 6 calls a minute), and asks ImageStatus only for an
// image whose ID is no longer listed.
package presence

import (
	"context"
	"errors"
	"log/slog"
	"slices"
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

// Image is one image found present.
type Image struct {
	// Name is the fully qualified reference (docker.io/library/busybox:1.36),
	// the name containerd records the image under.
	Name string
	// Ref is what CRI calls ask for (the kubelet's reference).
	Ref string
	// ID is the image ID the runtime reported.
	ID string
}

// Runtime is the part of the CRI the watcher needs.
type Runtime interface {
	ListImages(ctx context.Context) ([]string, error)
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
	// Gone is called with the images found gone, from Run's goroutine.
	// They leave the set: Watch sets it again.
	Gone func([]Image)

	mu  sync.Mutex
	set []Image
}

// Watch replaces the set of images to watch: what the last check found
// present.
func (w *Watcher) Watch(set []Image) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.set = slices.Clone(set)
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	if w.Events != nil && w.follow(ctx) {
		return
	}
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.look(ctx)
		}
	}
}

// follow reads the event stream, subscribing again whenever it breaks. It
// returns false at once when the runtime has no stream.
func (w *Watcher) follow(ctx context.Context) bool {
	const maxWait = 10 * time.Second
	wait := time.Second
	for {
		start := time.Now()
		err := w.Events.WatchImageDeletes(ctx, func() { w.look(ctx) }, w.deleted)
		if errors.Is(err, cri.ErrNoEvents) {
			w.Log.Info("the runtime has no image event stream: listing its images every interval to notice removals", "interval", w.Interval, "err", err)
			return false
		}
		if ctx.Err() != nil {
			return true
		}
		if time.Since(start) > maxWait {
			wait = time.Second
		}
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

// deleted handles one deleted image record: a name the set knows an image
// by (its reference, or its ID) is gone for the kubelet, which asks by
// that name.
func (w *Watcher) deleted(name string) {
	w.report(func(img Image) bool { return img.Name == name || img.Ref == name || img.ID == name })
}

// look lists the runtime's images and reports those of the set that are
// gone. An image whose ID is not listed is asked for by reference, so
// that one retagged to another ID (a newer image pulled under the same
// tag) is not reported.
func (w *Watcher) look(ctx context.Context) {
	w.mu.Lock()
	set := slices.Clone(w.set)
	w.mu.Unlock()
	if len(set) == 0 {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, callTimeout)
	ids, err := w.Runtime.ListImages(lctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.Log.Warn("cannot list the runtime's images to notice removals; trying again", "err", err)
		}
		return
	}
	listed := make(map[string]bool, len(ids))
	for _, id := range ids {
		listed[id] = true
	}
	gone := map[string]bool{}
	for _, img := range set {
		if listed[img.ID] {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, callTimeout)
		info, err := w.Runtime.ImageStatus(sctx, img.Ref)
		cancel()
		switch {
		case err != nil:
			w.Log.Warn("cannot tell whether an image is still present; looking again later", "image", img.Name, "err", err)
		case info == nil:
			gone[img.Name] = true
		default:
			w.retagged(img, info.ID)
		}
	}
	w.report(func(img Image) bool { return gone[img.Name] })
}

// retagged records that img is present under another ID now.
func (w *Watcher) retagged(img Image, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.set {
		if w.set[i].Name == img.Name {
			w.set[i].ID = id
		}
	}
}

// report takes the images matched by gone out of the set and calls Gone
// with them.
func (w *Watcher) report(gone func(Image) bool) {
	w.mu.Lock()
	var out []Image
	w.set = slices.DeleteFunc(w.set, func(img Image) bool {
		if gone(img) {
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
