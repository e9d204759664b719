// Package pin keeps an instance's images pinned in containerd, so that the
// kubelet's image garbage collection leaves them alone, within a budget of
// bytes on the image filesystem.
//
// A pin is containerd's label io.cri-containerd.pinned=pinned on an image
// record, in the CRI's namespace; the CRI then reports the image as pinned
// (a label on any one of its records pins the whole image), and the
// kubelet skips pinned images. The CRI has no call for it: the labels are
// written through containerd's own images API, on the same socket, one
// field path per label, so that labels others write survive.
//
// Who pinned what is recorded on the image record too:
//   - every instance that pins a record marks it with MarkKey(namespace,
//     name); several instances may mark the same record;
//   - the label SetByKey says that this project set the pin label. A pin
//     that was there before the first mark (the sandbox image, containerd's
//     own pinned_images, a pin set by hand) has no such label, and is never
//     removed.
//
// A record is unpinned when the last mark of this project goes, and only if
// SetByKey is there.
package pin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// Labels on containerd's image records.
const (
	// PinLabel is the label containerd's CRI reads; PinValue pins.
	PinLabel = "io.cri-containerd.pinned"
	PinValue = "pinned"
	// MarkPrefix starts every instance's mark.
	MarkPrefix = "image-prefetcher.stackrox.io/pin."
	// SetByKey says that this project set PinLabel; its value is SetByValue.
	SetByKey   = "image-prefetcher.stackrox.io/pin-set"
	SetByValue = "true"
)

// Reasons an image that is present is not pinned.
const (
	ReasonOverBudget = "OverBudget"
	ReasonPinFailed  = "PinFailed"
)

// MarkKey is the label by which the instance name of namespace ns marks the
// records it pins. Namespaces and instance names are DNS labels, which hold
// no '.', so the key names one instance.
func MarkKey(ns, name string) string { return MarkPrefix + ns + "." + name }

// Descriptor is an image record's target, as containerd stores it.
type Descriptor struct {
	MediaType string
	Digest    string
	Size      int64
}

// Record is one of containerd's image records: a name (a reference, or the
// image ID) pointing at a manifest or index.
type Record struct {
	Name   string
	Target Descriptor
	Labels map[string]string
}

// Store is containerd's store of image records, and of what they take on
// disk (Containerd).
type Store interface {
	// List returns the records matching a containerd filter.
	List(ctx context.Context, filter string) ([]Record, error)
	// Get returns one record; ErrNotFound when there is none.
	Get(ctx context.Context, name string) (Record, error)
	// SetLabels sets only the given labels of r ("" removes one) and
	// returns the record as written.
	SetLabels(ctx context.Context, r Record, labels map[string]string) (Record, error)
	// Unpacked returns the bytes of the unpacked layers of the image whose
	// ID (config digest) is id.
	Unpacked(ctx context.Context, id string) (uint64, error)
}

// Images is the CRI's view of an image: its ID, size and whether it is
// reported as pinned.
type Images interface {
	ImageStatus(ctx context.Context, ref string) (*cri.ImageInfo, error)
}

// Pinner pins one instance's images on one node. Its methods are not safe
// for concurrent use: fetch and watch call them from one goroutine.
type Pinner struct {
	Store Store
	CRI   Images
	// Namespace and Name are the instance's.
	Namespace, Name string
	// Budget returns the most bytes pinned images may take; nil turns
	// pinning off (and removes this instance's pins).
	Budget func(context.Context) (uint64, error)
	// Unsupported, when set, says why the runtime cannot pin: nothing is
	// pinned, and this instance's marks are removed.
	Unsupported string
	// Verify checks the first pin through the CRI, for a runtime whose
	// version does not tell (Check); one that does not report it cannot
	// pin.
	Verify bool
	// Log receives what is worth saying once.
	Log *slog.Logger
	// VerifyFor bounds the wait for the CRI to report the first pin:
	// containerd applies label changes to its CRI cache through its event
	// stream, a moment after the update (default 3s).
	VerifyFor time.Duration

	// sizes caches what each image takes on disk, by record target: an
	// image never changes.
	sizes map[string]imageSize
	mu    sync.Mutex // guards sizes
	// cleaned is set once the marks of an instance that cannot pin have
	// been removed.
	cleaned bool
	// notPinned holds the reason each image was not pinned for at the last
	// check, so that only a change is logged.
	notPinned, lastNotPinned map[string]string
}

type imageSize struct {
	id    string
	bytes uint64
}

func (p *Pinner) log() *slog.Logger {
	if p.Log == nil {
		return slog.Default()
	}
	return p.Log
}

func (p *Pinner) mark() string { return MarkKey(p.Namespace, p.Name) }

// Sync makes the pins follow a check's results: present images of the list
// are pinned in list order while the budget lasts, and this instance's
// marks on records that are no longer wanted are removed. It returns what
// the annotation reports, nil when pinning is off.
func (p *Pinner) Sync(ctx context.Context, results []pull.Result) *label.Pins {
	if p.Unsupported != "" {
		p.cleanUp(ctx)
		return &label.Pins{Unsupported: p.Unsupported}
	}
	if p.Budget == nil {
		if _, err := p.UnpinAll(ctx); err != nil && !errors.Is(err, ErrUnsupported) {
			p.log().Warn("pinning is off; removing this instance's pins failed, retrying at the next check", "err", err)
		}
		return nil
	}
	budget, err := p.Budget(ctx)
	if err != nil {
		p.log().Warn("not pinning new images: the pin budget is unknown; the list's pins stay as they were", "err", err)
		return p.keepListed(ctx, results, fmt.Sprintf("the pin budget is unknown: %v", err))
	}
	v, err := p.survey(ctx)
	if err != nil {
		if errors.Is(err, ErrUnsupported) {
			return p.unsupported(ctx, fmt.Sprintf("the runtime serves no containerd images API (%v)", err))
		}
		p.log().Warn("not pinning: listing the node's pins failed; they stay as they were", "err", err)
		return &label.Pins{BudgetBytes: budget, Error: err.Error()}
	}
	p.lastNotPinned, p.notPinned = p.notPinned, map[string]string{}
	keep := map[string]bool{}
	// The records and sizes of the present images are looked up first,
	// several at a time: each is a round trip to containerd, and on a
	// busy node they add up.
	var items []*item
	for _, r := range results {
		if r.Ref == "" {
			continue
		}
		name := recordName(r.Normalized)
		if !r.Present {
			// An image reported missing has no record, unless its status
			// call failed: a mark there stays until a check sees it.
			keep[name] = true
			continue
		}
		items = append(items, &item{r: r, name: name})
	}
	for _, it := range items {
		it.rec, it.marked = v.marked[it.name]
	}
	p.lookUp(ctx, v.all, items)
	// The claim is written before the listing the plan is made from (see
	// share.go): an instance that syncs at the same time sees it, or this
	// one sees its pins.
	mine := p.claimFor(v, items, budget)
	wrote, err := p.claim(ctx, v.all, items, mine)
	if err != nil {
		p.log().Warn("claiming a share of the node's pin budget failed; pinning within what is left", "err", err)
	}
	if wrote {
		if v, err = p.survey(ctx); err != nil {
			p.log().Warn("not pinning: listing the node's pins failed; they stay as they were", "err", err)
			return &label.Pins{BudgetBytes: budget, Error: err.Error()}
		}
		for _, it := range items {
			if r, ok := v.marked[it.name]; ok {
				it.rec, it.marked = r, true
			}
		}
	}
	nodeBudget := v.nodeBudget(budget)
	out := &label.Pins{BudgetBytes: nodeBudget}
	pinnedIDs := map[string]bool{}
	for _, it := range items {
		if it.marked && it.err == nil {
			pinnedIDs[it.sz.id] = true
		}
	}
	room := v.room(nodeBudget, pinnedIDs)
	// Within the room the other instances leave, this instance's pins
	// already set first (so that pins do not churn), then new ones, each
	// group in list order. An image under two references counts once; one
	// that an instance before this one by name pins takes nothing more.
	var toPin []*item
	var ownBytes uint64
	own := map[string]bool{}
	for _, group := range []bool{true, false} {
		for _, it := range items {
			if it.marked != group {
				continue
			}
			if it.err != nil {
				keep[it.name] = keep[it.name] || it.marked
				p.skip(out, it.r, ReasonPinFailed, it.err.Error())
				continue
			}
			if !own[it.sz.id] {
				c := v.cost(it.sz.id, it.sz.bytes)
				if ownBytes+c > room {
					p.skip(out, it.r, ReasonOverBudget, overBudget(it.sz.bytes, room-min(ownBytes, room), nodeBudget))
					continue
				}
				ownBytes += c
				own[it.sz.id] = true
			}
			keep[it.name] = true
			toPin = append(toPin, it)
		}
	}
	each(len(toPin), func(i int) { toPin[i].err = p.pin(ctx, toPin[i].rec) })
	if slices.ContainsFunc(toPin, func(it *item) bool { return !it.marked && it.err == nil }) {
		toPin = p.yield(ctx, toPin, keep, budget, mine.reserve, out)
	}
	var firstPinned pull.Result
	pinned := map[string]bool{}
	for _, it := range toPin {
		if it.err != nil {
			p.skip(out, it.r, ReasonPinFailed, it.err.Error())
			continue
		}
		if !pinned[it.sz.id] {
			out.Bytes += it.sz.bytes
			pinned[it.sz.id] = true
		}
		out.Images++
		if firstPinned.Ref == "" {
			firstPinned = it.r
		}
	}
	for name, rec := range v.marked {
		if keep[name] {
			continue
		}
		if err := p.unpin(ctx, rec); err != nil {
			p.log().Warn("removing a pin failed; retrying at the next check", "record", name, "err", err)
			continue
		}
		p.log().Info("unpinned an image that left the list or the budget", "record", name)
	}
	if firstPinned.Ref != "" && p.Verify {
		if err := p.verify(ctx, firstPinned); err != nil {
			if ctx.Err() != nil {
				return out
			}
			return p.unsupported(ctx, err.Error())
		}
	}
	return out
}

// keepListed is a pass that pins nothing new, when the budget is unknown:
// this instance's pins on images that left the list are removed, since
// nothing else would ever free them for the kubelet's image GC, and what
// stays pinned is reported.
func (p *Pinner) keepListed(ctx context.Context, results []pull.Result, why string) *label.Pins {
	out := &label.Pins{Error: why}
	marked, err := p.marked(ctx)
	if err != nil {
		if errors.Is(err, ErrUnsupported) {
			return p.unsupported(ctx, fmt.Sprintf("the runtime serves no containerd images API (%v)", err))
		}
		out.Error = fmt.Sprintf("%s; listing the node's pins failed: %v", why, err)
		return out
	}
	listed := map[string]bool{}
	for _, r := range results {
		if r.Ref != "" {
			listed[recordName(r.Normalized)] = true
		}
	}
	counted := map[string]bool{}
	for name, rec := range marked {
		if !listed[name] {
			if err := p.unpin(ctx, rec); err != nil {
				p.log().Warn("removing a pin failed; retrying at the next check", "record", name, "err", err)
				continue
			}
			p.log().Info("unpinned an image that left the list", "record", name)
			continue
		}
		out.Images++
		if sz, err := p.sizeOf(ctx, rec); err == nil && !counted[sz.id] {
			out.Bytes += sz.bytes
			counted[sz.id] = true
		}
	}
	return out
}

// overBudget says why an image of size bytes is not pinned: left is what
// the other instances leave of the node's budget, less this one's pins.
func overBudget(size, left, node uint64) string {
	return fmt.Sprintf("takes %s; %s of the node's pin budget of %s is left to this instance "+
		"(the others' pins and shares counted)", disk.Bytes(size), disk.Bytes(left), disk.Bytes(node))
}

// claimFor is this instance's claim: its budget, what its present images
// take within it, and what of them fits in its share of the node's budget.
func (p *Pinner) claimFor(v *view, items []*item, budget uint64) claim {
	c := claim{budget: budget, wants: wants(items, budget)}
	c.reserve = wants(items, v.share(c.wants, v.nodeBudget(budget)))
	return c
}

// yield lists the node again after this instance pinned new images, and
// gives up the last of toPin, in list order, when the node is then over
// its budget and this instance past its reserve (share.go): another
// instance pinned at the same time. It returns what stays pinned.
func (p *Pinner) yield(ctx context.Context, toPin []*item, keep map[string]bool, budget, reserve uint64,
	out *label.Pins) []*item {
	v, err := p.survey(ctx)
	if err != nil {
		p.log().Warn("listing the node's pins again after pinning failed; checking the budget at the next sync", "err", err)
		return toPin
	}
	node := v.nodeBudget(budget)
	out.BudgetBytes = node
	mine := map[string]bool{}
	var own uint64
	for _, it := range toPin {
		if it.err == nil && !mine[it.sz.id] {
			mine[it.sz.id] = true
			own += v.cost(it.sz.id, it.sz.bytes)
		}
	}
	give := v.excess(own, reserve, node, mine)
	for i := len(toPin) - 1; i >= 0 && give > 0; i-- {
		it := toPin[i]
		if it.err != nil {
			continue
		}
		if rec, ok := v.all[it.name]; ok {
			if err := p.unpin(ctx, rec); err != nil {
				p.log().Warn("giving up a pin past the node's budget failed; retrying at the next sync",
					"record", it.name, "err", err)
				continue
			}
		}
		give -= min(give, v.cost(it.sz.id, it.sz.bytes))
		keep[it.name] = false
		p.skip(out, it.r, ReasonOverBudget, overBudget(it.sz.bytes, 0, node))
		toPin = slices.Delete(toPin, i, i+1)
	}
	return toPin
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

func (p *Pinner) skip(out *label.Pins, r pull.Result, reason, message string) {
	if p.lastNotPinned[r.Normalized] != reason {
		p.log().Info("image present but not pinned", "image", r.Normalized, "reason", reason, "why", message)
	}
	p.notPinned[r.Normalized] = reason
	out.NotPin(r.Image, reason, message)
}

// item is one present image of the list on its way to a pin.
type item struct {
	r      pull.Result
	name   string
	rec    Record
	marked bool
	sz     imageSize
	err    error
}

// sizeOf is size, cached by the record's target: an image never changes.
func (p *Pinner) sizeOf(ctx context.Context, r Record) (imageSize, error) {
	p.mu.Lock()
	sz, ok := p.sizes[r.Target.Digest]
	p.mu.Unlock()
	if ok {
		return sz, nil
	}
	sz, err := p.size(ctx, r.Name)
	if err != nil {
		return sz, err
	}
	p.mu.Lock()
	if p.sizes == nil {
		p.sizes = map[string]imageSize{}
	}
	p.sizes[r.Target.Digest] = sz
	p.mu.Unlock()
	return sz, nil
}

// lookUp finds the record and the size of each item, setting err where it
// cannot. all holds every record by name.
func (p *Pinner) lookUp(ctx context.Context, all map[string]Record, items []*item) {
	for _, it := range items {
		if it.marked {
			continue
		}
		var ok bool
		if it.rec, ok = all[it.name]; !ok {
			it.err = fmt.Errorf("no image record %s", it.name)
		}
	}
	each(len(items), func(i int) {
		it := items[i]
		if it.err != nil {
			return
		}
		if it.sz, it.err = p.sizeOf(ctx, Record{Name: it.r.Ref, Target: it.rec.Target}); it.err != nil {
			it.err = fmt.Errorf("size on disk unknown: %w", it.err)
		}
	})
}

// parallelism bounds the calls to containerd one check makes at once.
const parallelism = 4

// each calls f(i) for every i below n, parallelism at a time.
func each(n int, f func(i int)) {
	sem := make(chan struct{}, parallelism)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// unsupported turns pinning off for good, after the runtime proved unable
// to pin: it says so once and removes this instance's marks, which would
// mislead.
func (p *Pinner) unsupported(ctx context.Context, why string) *label.Pins {
	p.Unsupported = why
	p.log().Warn("this node's runtime cannot pin images; prefetched images are not protected from the kubelet's image garbage collection", "why", why)
	p.cleanUp(ctx)
	return &label.Pins{Unsupported: why}
}

// cleanUp removes this instance's marks once, on a runtime that cannot pin
// (left by a check that verified the runtime the hard way). A runtime with
// no images API holds none.
func (p *Pinner) cleanUp(ctx context.Context) {
	if p.cleaned {
		return
	}
	n, err := p.UnpinAll(ctx)
	switch {
	case err == nil || errors.Is(err, ErrUnsupported):
		p.cleaned = true
		if n > 0 {
			p.log().Info("removed this instance's pin labels, which this runtime does not honour", "records", n)
		}
	case ctx.Err() == nil:
		p.log().Warn("removing this instance's pin labels failed; retrying at the next check", "err", err)
	}
}

// verify waits until the CRI reports r's image as pinned, for at most
// VerifyFor. It fails only when the record still carries the pin label
// then: a pin another instance removed meanwhile proves nothing.
func (p *Pinner) verify(ctx context.Context, r pull.Result) error {
	wait := p.VerifyFor
	if wait <= 0 {
		wait = 3 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		info, err := p.CRI.ImageStatus(ctx, r.Ref)
		if err == nil && info != nil && info.Pinned {
			p.Verify = false
			p.log().Info("pinning images: the runtime reports the pins", "image", r.Normalized)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if err != nil {
				p.log().Warn("could not ask the CRI whether a pin holds; asking again at the next check", "image", r.Normalized, "err", err)
				return nil
			}
			rec, gerr := p.Store.Get(ctx, recordName(r.Normalized))
			if gerr != nil || rec.Labels[PinLabel] != PinValue {
				return nil
			}
			return fmt.Errorf("the runtime keeps the pin label on %s, but its CRI does not report the image as pinned, so the kubelet's image garbage collection would remove it anyway (containerd before 1.6.25 and 1.7.10, containerd #9338)", rec.Name)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// UnpinAll removes this instance's marks from every record, and the pins
// nobody else wants: on uninstall, when pinning is turned off, on a
// runtime that cannot pin. It returns how many records it unmarked.
func (p *Pinner) UnpinAll(ctx context.Context) (int, error) {
	marked, err := p.marked(ctx)
	if err != nil {
		return 0, err
	}
	// Several at a time: on uninstall this runs within the pod's grace
	// period, and one by one 150 records took longer than it gave.
	recs := slices.Collect(maps.Values(marked))
	errs := make([]error, len(recs))
	each(len(recs), func(i int) { errs[i] = p.unpin(ctx, recs[i]) })
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	if err := p.unclaim(ctx); err != nil && !errors.Is(err, ErrUnsupported) {
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// marked returns this instance's marked records by name.
func (p *Pinner) marked(ctx context.Context) (map[string]Record, error) {
	list, err := p.Store.List(ctx, `labels."`+p.mark()+`"`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Record, len(list))
	for _, r := range list {
		out[r.Name] = r
	}
	return out, nil
}

// pin marks rec and pins it unless it is pinned already. A record read as
// unpinned gets the mark and the pin in one update. One read as pinned gets
// the mark, and the answer tells whether the pin is still there: the last
// instance that marked it may have cleared it meanwhile. An instance that
// clears a pin reads the marks in its own update's answer, and sets the pin
// again if one appeared, so that either side restores it.
func (p *Pinner) pin(ctx context.Context, rec Record) error {
	labels := map[string]string{}
	if rec.Labels[p.mark()] == "" {
		labels[p.mark()] = p.Namespace + "/" + p.Name
	}
	// A pin there before, without SetByKey, is someone else's (the sandbox
	// image, pinned_images, a pin set by hand): it is left as it is, and
	// so never removed.
	if rec.Labels[PinLabel] != PinValue {
		labels[PinLabel], labels[SetByKey] = PinValue, SetByValue
	}
	if len(labels) == 0 {
		return nil
	}
	after, err := p.Store.SetLabels(ctx, rec, labels)
	if err != nil {
		return fmt.Errorf("pin %s: %w", rec.Name, err)
	}
	if labels[PinLabel] == "" && after.Labels[PinLabel] != PinValue {
		// The last other instance cleared the pin after it was read here,
		// and before this mark.
		if _, err := p.Store.SetLabels(ctx, after, map[string]string{PinLabel: PinValue, SetByKey: SetByValue}); err != nil {
			return fmt.Errorf("pin %s: %w", rec.Name, err)
		}
		labels[PinLabel] = PinValue
	}
	if labels[PinLabel] != "" {
		p.log().Info("pinned", "record", rec.Name)
	}
	return nil
}

// unpin removes this instance's mark from rec, and the pin when this
// project set it and no other mark of it is left.
func (p *Pinner) unpin(ctx context.Context, rec Record) error {
	rec, err := p.Store.SetLabels(ctx, rec, map[string]string{p.mark(): ""})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unmark %s: %w", rec.Name, err)
	}
	if marked(rec.Labels) || rec.Labels[SetByKey] != SetByValue {
		return nil
	}
	after, err := p.Store.SetLabels(ctx, rec, map[string]string{PinLabel: "", SetByKey: ""})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unpin %s: %w", rec.Name, err)
	}
	if marked(after.Labels) {
		// Another instance marked it meanwhile, and saw the pin there:
		// put it back for it.
		if _, err := p.Store.SetLabels(ctx, after, map[string]string{PinLabel: PinValue, SetByKey: SetByValue}); err != nil {
			return fmt.Errorf("pin %s again for another instance: %w", rec.Name, err)
		}
	}
	return nil
}

// marked reports whether labels hold any instance's mark.
func marked(labels map[string]string) bool {
	for k, v := range labels {
		if strings.HasPrefix(k, MarkPrefix) && v != "" {
			return true
		}
	}
	return false
}

// size returns what the image ref names takes on the image filesystem:
// its content, as the CRI counts it, and its unpacked layers.
func (p *Pinner) size(ctx context.Context, ref string) (imageSize, error) {
	info, err := p.CRI.ImageStatus(ctx, ref)
	if err != nil {
		return imageSize{}, err
	}
	if info == nil {
		return imageSize{}, fmt.Errorf("the CRI does not know %s", ref)
	}
	unpacked, err := p.Store.Unpacked(ctx, info.ID)
	if err != nil {
		return imageSize{}, err
	}
	return imageSize{id: info.ID, bytes: info.Size + unpacked}, nil
}

// recordName is the name of the image record containerd's CRI keeps for a
// normalized reference: a reference with both a tag and a digest is known
// by its digest alone.
func recordName(normalized string) string {
	at := strings.IndexByte(normalized, '@')
	if at < 0 {
		return normalized
	}
	name := normalized[:at]
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name = name[:i]
	}
	return name + normalized[at:]
}
