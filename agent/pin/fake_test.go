package pin

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// fakeStore is containerd's image store as the images API shows it:
// records by name, label updates by field path ("" removes a label), and
// listing, all records or by the presence of a label. It also answers the
// CRI's ImageStatus, pinned when any record of the image carries the pin
// label (containerd #8867), unless criIgnoresPins (containerd 1.6.20).
type fakeStore struct {
	mu       sync.Mutex
	records  map[string]Record
	images   map[string]fakeImage // by target digest
	calls    int
	failList error
	// beforeSet, when set, runs before each SetLabels, outside the lock.
	beforeSet func(name string, labels map[string]string)
	// setLatency is how long each SetLabels takes, as containerd's
	// update does on a busy node; it gives up when ctx ends.
	setLatency     time.Duration
	criIgnoresPins bool
	// setting is the SetLabels calls in progress; mostSetting, the most
	// seen at once.
	setting, mostSetting int
}

type fakeImage struct {
	id             string
	size, unpacked uint64
}

func newFakeStore() *fakeStore {
	return &fakeStore{records: map[string]Record{}, images: map[string]fakeImage{}}
}

// add creates an image of the given sizes under one or more record names.
func (s *fakeStore) add(digest string, size, unpacked uint64, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.images[digest] = fakeImage{id: "sha256:id-" + digest, size: size, unpacked: unpacked}
	for _, n := range names {
		s.records[n] = Record{Name: n, Target: Descriptor{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digest, Size: 100}, Labels: map[string]string{"io.cri-containerd.image": "managed"}}
	}
}

func (s *fakeStore) labels(name string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.records[name].Labels)
}

func (s *fakeStore) setRaw(name string, labels map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.records[name]
	for k, v := range labels {
		if v == "" {
			delete(r.Labels, k)
		} else {
			r.Labels[k] = v
		}
	}
}

func (s *fakeStore) List(_ context.Context, filter string) ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.failList != nil {
		return nil, s.failList
	}
	var out []Record
	if filter == "" {
		for _, r := range s.records {
			out = append(out, clone(r))
		}
		return out, nil
	}
	key, ok := strings.CutPrefix(filter, `labels."`)
	key, ok2 := strings.CutSuffix(key, `"`)
	if !ok || !ok2 {
		return nil, fmt.Errorf("fake store: unsupported filter %q", filter)
	}
	for _, r := range s.records {
		if _, has := r.Labels[key]; has {
			out = append(out, clone(r))
		}
	}
	return out, nil
}

func (s *fakeStore) Get(_ context.Context, name string) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	r, ok := s.records[name]
	if !ok {
		return Record{}, fmt.Errorf("get %s: %w", name, ErrNotFound)
	}
	return clone(r), nil
}

func (s *fakeStore) SetLabels(ctx context.Context, rec Record, labels map[string]string) (Record, error) {
	if s.beforeSet != nil {
		s.beforeSet(rec.Name, labels)
	}
	s.mu.Lock()
	s.setting++
	s.mostSetting = max(s.mostSetting, s.setting)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.setting--
		s.mu.Unlock()
	}()
	if s.setLatency > 0 {
		t := time.NewTimer(s.setLatency)
		select {
		case <-ctx.Done():
			t.Stop()
			return Record{}, ctx.Err()
		case <-t.C:
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	r, ok := s.records[rec.Name]
	if !ok {
		return Record{}, fmt.Errorf("update %s: %w", rec.Name, ErrNotFound)
	}
	for k, v := range labels {
		if v == "" {
			delete(r.Labels, k)
		} else {
			r.Labels[k] = v
		}
	}
	return clone(r), nil
}

func (s *fakeStore) Unpacked(_ context.Context, id string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	for _, img := range s.images {
		if img.id == id {
			return img.unpacked, nil
		}
	}
	return 0, fmt.Errorf("content %s: %w", id, ErrNotFound)
}

// ImageStatus answers for a record name used as the reference.
func (s *fakeStore) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	r, ok := s.records[recordName(ref)]
	if !ok {
		return nil, nil
	}
	img := s.images[r.Target.Digest]
	pinned := false
	for _, o := range s.records {
		if o.Target.Digest == r.Target.Digest && o.Labels[PinLabel] == PinValue {
			pinned = !s.criIgnoresPins
		}
	}
	return &cri.ImageInfo{ID: img.id, Size: img.size, Pinned: pinned}, nil
}

func clone(r Record) Record {
	r.Labels = maps.Clone(r.Labels)
	return r
}

// present is a check's result for a present image listed as ref (already
// normalized).
func present(ref string) pull.Result {
	return pull.Result{Image: ref, Normalized: ref, Ref: ref, Present: true}
}

func missing(ref string) pull.Result {
	return pull.Result{Image: ref, Normalized: ref, Ref: ref, Reason: pull.ReasonMissing}
}
