package pin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

const (
	refA  = "docker.io/library/a:1"
	refB  = "docker.io/library/b:1"
	refC  = "docker.io/library/c:1"
	pause = "registry.k8s.io/pause:3.10"
)

func budget(n uint64) func(context.Context) (uint64, error) {
	return func(context.Context) (uint64, error) { return n, nil }
}

func newPinner(s *fakeStore, ns, name string, b uint64) *Pinner {
	return &Pinner{Store: s, CRI: s, Namespace: ns, Name: name, Budget: budget(b)}
}

func pinnedNames(s *fakeStore) []string {
	var out []string
	for _, n := range []string{refA, refB, refC, pause} {
		if s.labels(n)[PinLabel] == PinValue {
			out = append(out, n)
		}
	}
	return out
}

func notPinned(p *label.Pins) string {
	var parts []string
	for _, f := range p.NotPinned {
		parts = append(parts, f.Image+":"+f.Reason)
	}
	return strings.Join(parts, ",")
}

// The budget counts content and unpacked layers, in list order; an image
// that does not fit is pulled but not pinned, and a smaller one after it
// still is.
func TestSyncBudget(t *testing.T) {
	tests := []struct {
		name          string
		budget        uint64
		list          []pull.Result
		wantPinned    []string
		wantBytes     uint64
		wantNotPinned string
	}{
		{name: "all fit", budget: 1000, list: []pull.Result{present(refA), present(refB), present(refC)},
			wantPinned: []string{refA, refB, refC}, wantBytes: 300 + 500 + 100},
		{name: "exactly the budget", budget: 900, list: []pull.Result{present(refA), present(refB), present(refC)},
			wantPinned: []string{refA, refB, refC}, wantBytes: 900},
		{name: "list order: the second does not fit, the third does", budget: 450, list: []pull.Result{present(refA), present(refB), present(refC)},
			wantPinned: []string{refA, refC}, wantBytes: 400, wantNotPinned: refB + ":OverBudget"},
		{name: "another order pins another set", budget: 550, list: []pull.Result{present(refB), present(refA), present(refC)},
			wantPinned: []string{refB}, wantBytes: 500, wantNotPinned: refA + ":OverBudget," + refC + ":OverBudget"},
		{name: "zero budget pins nothing", budget: 0, list: []pull.Result{present(refA)},
			wantNotPinned: refA + ":OverBudget"},
		{name: "missing images are not pinned and take no budget", budget: 300, list: []pull.Result{missing(refB), present(refA)},
			wantPinned: []string{refA}, wantBytes: 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFakeStore()
			s.add("dA", 100, 200, refA) // 300 on disk
			s.add("dB", 200, 300, refB) // 500
			s.add("dC", 40, 60, refC)   // 100
			p := newPinner(s, "ns", "inst", tt.budget)
			got := p.Sync(context.Background(), tt.list)
			if got == nil || got.Error != "" || got.Unsupported != "" {
				t.Fatalf("Sync = %+v", got)
			}
			if g := pinnedNames(s); strings.Join(g, ",") != strings.Join(tt.wantPinned, ",") {
				t.Errorf("pinned %v, want %v", g, tt.wantPinned)
			}
			if got.Images != len(tt.wantPinned) || got.Bytes != tt.wantBytes || got.BudgetBytes != tt.budget {
				t.Errorf("report images=%d bytes=%d budget=%d, want %d, %d, %d", got.Images, got.Bytes, got.BudgetBytes, len(tt.wantPinned), tt.wantBytes, tt.budget)
			}
			if g := notPinned(got); g != tt.wantNotPinned {
				t.Errorf("not pinned %q, want %q", g, tt.wantNotPinned)
			}
			for _, n := range tt.wantPinned {
				l := s.labels(n)
				if l[MarkKey("ns", "inst")] != "ns/inst" || l[SetByKey] != SetByValue || l["io.cri-containerd.image"] != "managed" {
					t.Errorf("%s labels %v: want the mark, the set-by label, and containerd's own label kept", n, l)
				}
			}
		})
	}
}

// Two references of one image (a tag and its digest) pin two records, and
// count once.
func TestSyncCountsAnImageOnce(t *testing.T) {
	s := newFakeStore()
	digestRef := "docker.io/library/a@sha256:" + strings.Repeat("a", 64)
	s.add("dA", 100, 200, refA, digestRef)
	p := newPinner(s, "ns", "inst", 300)
	got := p.Sync(context.Background(), []pull.Result{present(refA), present(digestRef)})
	if got.Images != 2 || got.Bytes != 300 || len(got.NotPinned) != 0 {
		t.Fatalf("Sync = %+v, want both references pinned within 300 bytes", got)
	}
}

// Marks: a list change unpins what left; a pin that was there before the
// first mark, or that another instance still marks, stays.
func TestOwnership(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	s.add("dB", 10, 10, refB)
	s.add("dP", 10, 10, pause)
	// containerd's pinned_images pinned the sandbox image on pull.
	s.setRaw(pause, map[string]string{PinLabel: PinValue})
	one := newPinner(s, "ns1", "one", 1000)
	two := newPinner(s, "ns2", "one", 1000) // same name, other namespace

	one.Sync(ctx, []pull.Result{present(refA), present(refB), present(pause)})
	two.Sync(ctx, []pull.Result{present(refB)})
	if got := pinnedNames(s); strings.Join(got, ",") != strings.Join([]string{refA, refB, pause}, ",") {
		t.Fatalf("pinned %v", got)
	}
	if l := s.labels(pause); l[SetByKey] != "" || l[MarkKey("ns1", "one")] == "" {
		t.Fatalf("sandbox labels %v: want marked, but not recorded as pinned by this project", l)
	}

	// The list of "one" loses b and the pause image.
	one.Sync(ctx, []pull.Result{present(refA)})
	if l := s.labels(refB); l[PinLabel] != PinValue || l[MarkKey("ns1", "one")] != "" || l[MarkKey("ns2", "one")] == "" {
		t.Errorf("b labels %v: want still pinned for ns2/one, without ns1/one's mark", l)
	}
	if l := s.labels(pause); l[PinLabel] != PinValue || l[MarkKey("ns1", "one")] != "" {
		t.Errorf("pause labels %v: want its own pin kept, the mark gone", l)
	}

	// Uninstalling "one" unpins a; uninstalling "two" unpins b.
	if n, err := one.UnpinAll(ctx); err != nil || n != 1 {
		t.Fatalf("UnpinAll = %d, %v; want 1", n, err)
	}
	if l := s.labels(refA); l[PinLabel] != "" || l[SetByKey] != "" || marked(l) {
		t.Errorf("a labels %v: want no pin and no marks", l)
	}
	if _, err := two.UnpinAll(ctx); err != nil {
		t.Fatal(err)
	}
	if l := s.labels(refB); l[PinLabel] != "" || marked(l) {
		t.Errorf("b labels %v: want unpinned once the last mark went", l)
	}
	if l := s.labels(pause); l[PinLabel] != PinValue {
		t.Errorf("pause labels %v: the runtime's pin must survive", l)
	}
	if got := pinnedNames(s); strings.Join(got, ",") != pause {
		t.Errorf("pinned %v, want only the sandbox image", got)
	}
}

// An instance that marks a record while another removes the last mark
// keeps its pin: the remover sees the new mark after clearing the pin, and
// puts the pin back.
func TestUnpinRacesAMark(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	one := newPinner(s, "ns", "one", 1000)
	one.Sync(ctx, []pull.Result{present(refA)})
	// Just before "one" clears the pin, "two" marks the record (it read
	// the pin as there, so it will not pin it itself).
	s.beforeSet = func(name string, labels map[string]string) {
		if _, clearing := labels[PinLabel]; clearing && labels[PinLabel] == "" {
			s.setRaw(name, map[string]string{MarkKey("ns", "two"): "ns/two"})
		}
	}
	if _, err := one.UnpinAll(ctx); err != nil {
		t.Fatal(err)
	}
	if l := s.labels(refA); l[PinLabel] != PinValue || l[SetByKey] != SetByValue || l[MarkKey("ns", "two")] == "" {
		t.Errorf("labels %v: want pinned again for ns/two", l)
	}
}

// An instance that read the pin as there, and marks the record after the
// last other instance cleared it, pins it again.
func TestMarkRacesAnUnpin(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	one := newPinner(s, "ns", "one", 1000)
	two := newPinner(s, "ns", "two", 1000)
	two.Verify = true // a pin that another instance removed is no verdict
	one.Sync(ctx, []pull.Result{present(refA)})
	// "two" reads the record pinned; then, before its mark lands, "one"
	// leaves and clears the pin.
	s.beforeSet = func(name string, labels map[string]string) {
		if _, marking := labels[MarkKey("ns", "two")]; marking {
			s.beforeSet = nil
			if _, err := one.UnpinAll(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	got := two.Sync(ctx, []pull.Result{present(refA)})
	if got.Images != 1 {
		t.Fatalf("Sync = %+v", got)
	}
	if l := s.labels(refA); l[PinLabel] != PinValue || l[SetByKey] != SetByValue || l[MarkKey("ns", "one")] != "" {
		t.Errorf("labels %v: want pinned for ns/two alone", l)
	}
}

// The steady state costs one List call.
func TestSyncSteadyState(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	s.add("dB", 10, 10, refB)
	p := newPinner(s, "ns", "one", 1000)
	list := []pull.Result{present(refA), present(refB)}
	p.Sync(ctx, list)
	s.calls = 0
	got := p.Sync(ctx, list)
	if s.calls != 1 || got.Images != 2 {
		t.Errorf("second Sync made %d calls and reported %+v; want 1 call (List)", s.calls, got)
	}
}

// Turning pinning off removes this instance's pins.
func TestSyncOff(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	p := newPinner(s, "ns", "one", 1000)
	p.Sync(ctx, []pull.Result{present(refA)})
	p.Budget = nil
	if got := p.Sync(ctx, []pull.Result{present(refA)}); got != nil {
		t.Errorf("Sync with pinning off = %+v, want nil", got)
	}
	if l := s.labels(refA); l[PinLabel] != "" || marked(l) {
		t.Errorf("labels %v: want unpinned", l)
	}
}

// A runtime that keeps the label but does not report the pin (containerd
// 1.6.20) is found out at the first pin, said once, and left without the
// labels that would mislead.
func TestSyncVerifiesThePin(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.criIgnoresPins = true
	s.add("dA", 10, 10, refA)
	p := newPinner(s, "ns", "one", 1000)
	p.Verify, p.VerifyFor = true, 1 // one look
	got := p.Sync(ctx, []pull.Result{present(refA)})
	if got.Unsupported == "" || got.Images != 0 {
		t.Fatalf("Sync = %+v, want unsupported", got)
	}
	if l := s.labels(refA); l[PinLabel] != "" || marked(l) || l[SetByKey] != "" {
		t.Errorf("labels %v: want none of this project's labels left", l)
	}
	s.calls = 0
	again := p.Sync(ctx, []pull.Result{present(refA)})
	if again.Unsupported != got.Unsupported || s.calls != 0 {
		t.Errorf("second Sync = %+v after %d calls; want the same answer without asking the runtime", again, s.calls)
	}
}

// Unsupported from the start (Check): nothing is written; marks an older
// agent left are removed once.
func TestSyncUnsupported(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	s.setRaw(refA, map[string]string{MarkKey("ns", "one"): "ns/one", PinLabel: PinValue, SetByKey: SetByValue})
	p := newPinner(s, "ns", "one", 1000)
	p.Unsupported = "containerd 1.6.20 ..."
	for range 2 {
		if got := p.Sync(ctx, []pull.Result{present(refA)}); got.Unsupported != p.Unsupported {
			t.Fatalf("Sync = %+v", got)
		}
	}
	if l := s.labels(refA); l[PinLabel] != "" || marked(l) {
		t.Errorf("labels %v: want the old pin removed", l)
	}

	// A runtime without the images API (CRI-O) is left alone.
	s.failList = errors.Join(ErrUnsupported)
	q := newPinner(s, "ns", "one", 1000)
	q.Unsupported = "CRI-O ..."
	if got := q.Sync(ctx, nil); got.Unsupported != q.Unsupported {
		t.Errorf("Sync = %+v", got)
	}
}

// A store that fails leaves the pins as they are and says why.
func TestSyncStoreDown(t *testing.T) {
	s := newFakeStore()
	s.add("dA", 10, 10, refA)
	p := newPinner(s, "ns", "one", 1000)
	p.Sync(context.Background(), []pull.Result{present(refA)})
	s.failList = errors.New("connection refused")
	got := p.Sync(context.Background(), []pull.Result{})
	if got.Error == "" {
		t.Errorf("Sync = %+v, want an error", got)
	}
	if l := s.labels(refA); l[PinLabel] != PinValue {
		t.Errorf("labels %v: want the pin kept", l)
	}
}

func TestRecordName(t *testing.T) {
	d := "@sha256:" + strings.Repeat("a", 64)
	for in, want := range map[string]string{
		"docker.io/library/a:1":             "docker.io/library/a:1",
		"docker.io/library/a:1" + d:         "docker.io/library/a" + d,
		"docker.io/library/a" + d:           "docker.io/library/a" + d,
		"localhost:5000/x/y:tag" + d:        "localhost:5000/x/y" + d,
		"localhost:5000/x/y" + d:            "localhost:5000/x/y" + d,
		"registry.example:443/team/app:1.0": "registry.example:443/team/app:1.0",
	} {
		if got := recordName(in); got != want {
			t.Errorf("recordName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		runtime, version string
		can              bool
	}{
		{"containerd", "1.6.20~ds1", false}, // Debian 12
		{"containerd", "v1.6.24", false},
		{"containerd", "v1.6.25", true},
		{"containerd", "1.7.9", false},
		{"containerd", "1.7.10", true},
		{"containerd", "v1.5.18", false},
		{"containerd", "v2.0.0", true},
		{"containerd", "2.4.2+unknown", true},
		{"containerd", "v2.4.2", true},
		{"containerd", "devel", true}, // unknown: verified at the first pin (below)
		{"cri-o", "1.34.0", false},
		{"docker", "28.0", false},
	}
	for _, tt := range tests {
		why, verify := Check(tt.runtime, tt.version)
		if (why == "") != tt.can {
			t.Errorf("Check(%q, %q) = %q, want can pin: %v", tt.runtime, tt.version, why, tt.can)
		}
		if want := tt.version == "devel"; verify != want {
			t.Errorf("Check(%q, %q) verify = %v, want %v", tt.runtime, tt.version, verify, want)
		}
	}
}

// The budget is the node's (finding 6 of issue 38): a second instance
// counts the first one's pins, pins only what still fits, and never undoes
// the first one's pins; the first, at its next check, keeps them.
func TestBudgetPerNode(t *testing.T) {
	tests := []struct {
		name             string
		budget           uint64
		oneList, twoList []string
		wantPinned       []string
		wantNotPinned    string // the second instance's
	}{
		{name: "the second's image does not fit beside the first's", budget: 550,
			oneList: []string{refA, refC}, twoList: []string{refB, refC},
			wantPinned: []string{refA, refC}, wantNotPinned: refB + ":OverBudget"},
		{name: "an image both pin counts once", budget: 550,
			oneList: []string{refA}, twoList: []string{refA, refC},
			wantPinned: []string{refA, refC}},
		{name: "room for both", budget: 1000,
			oneList: []string{refA, refC}, twoList: []string{refB},
			wantPinned: []string{refA, refB, refC}},
	}
	results := func(refs []string) []pull.Result {
		var out []pull.Result
		for _, r := range refs {
			out = append(out, present(r))
		}
		return out
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := newFakeStore()
			s.add("dA", 100, 200, refA) // 300 on disk
			s.add("dB", 200, 300, refB) // 500
			s.add("dC", 40, 60, refC)   // 100
			one, two := newPinner(s, "ns", "one", tt.budget), newPinner(s, "ns", "two", tt.budget)
			one.Sync(ctx, results(tt.oneList))
			firsts := pinnedNames(s)
			got := two.Sync(ctx, results(tt.twoList))
			if n := notPinned(got); n != tt.wantNotPinned {
				t.Errorf("the second's not pinned = %q, want %q", n, tt.wantNotPinned)
			}
			for range 2 {
				one.Sync(ctx, results(tt.oneList))
				two.Sync(ctx, results(tt.twoList))
			}
			pinned := pinnedNames(s)
			if strings.Join(pinned, ",") != strings.Join(tt.wantPinned, ",") {
				t.Errorf("pinned = %v, want %v", pinned, tt.wantPinned)
			}
			for _, f := range firsts {
				if s.labels(f)[MarkKey("ns", "one")] == "" {
					t.Errorf("the first instance's pin on %s was undone", f)
				}
			}
			var bytes uint64
			for _, n := range pinned {
				info, _ := s.ImageStatus(ctx, n)
				unpacked, _ := s.Unpacked(ctx, info.ID)
				bytes += info.Size + unpacked
			}
			if bytes > tt.budget {
				t.Errorf("the node's pins take %d bytes, over the budget of %d", bytes, tt.budget)
			}
		})
	}
}

// Uninstall (finding 4 of issue 38): 150 pinned images are all unmarked
// and unpinned, parallelism updates at a time. One by one, at 10 ms per
// containerd update, they took longer than the pod's grace period gave.
// Counted, not timed: a loaded machine slows any pace.
func TestUnpinAllManyAtOnce(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	var list []pull.Result
	for i := range 150 {
		ref := fmt.Sprintf("docker.io/library/img%d:1", i)
		s.add(fmt.Sprintf("d%d", i), 10, 10, ref)
		list = append(list, present(ref))
	}
	p := newPinner(s, "ns", "inst", 1<<30)
	if got := p.Sync(ctx, list); got.Images != 150 {
		t.Fatalf("Sync pinned %d images, want 150: %+v", got.Images, got)
	}
	s.setLatency = 10 * time.Millisecond
	s.mostSetting = 0
	if n, err := p.UnpinAll(ctx); err != nil || n != 150 {
		t.Errorf("UnpinAll = %d, %v; want 150, nil", n, err)
	}
	if s.mostSetting != parallelism {
		t.Errorf("at most %d updates at once, want %d", s.mostSetting, parallelism)
	}
	left := 0
	for _, l := range list {
		if ls := s.labels(l.Ref); ls[MarkKey("ns", "inst")] != "" || ls[PinLabel] != "" {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d of 150 records still carry the mark or the pin", left)
	}
}

// Issue 48, finding 5: with the budget unknown, nothing new is pinned, but
// this instance's pins on images that left the list go (nothing else would
// free them for the kubelet's GC), and the annotation counts what stays.
// Before, Sync returned before its unpin pass and reported 0 images.
func TestSyncUnknownBudgetStillUnpins(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	s.add("dA", 100, 200, refA)
	s.add("dB", 10, 10, refB)
	s.add("dC", 40, 60, refC)
	p := newPinner(s, "ns", "one", 1000)
	p.Sync(ctx, []pull.Result{present(refA), present(refB)})
	p.Budget = func(context.Context) (uint64, error) { return 0, errors.New("no node figures") }
	got := p.Sync(ctx, []pull.Result{present(refA), present(refC)})
	if pinned := strings.Join(pinnedNames(s), ","); pinned != refA {
		t.Errorf("pinned %s, want %s only: b left the list, c is new", pinned, refA)
	}
	if got.Error == "" || got.Images != 1 || got.Bytes != 300 {
		t.Errorf("Sync = %+v, want an error, 1 image of 300 bytes pinned", got)
	}
}

// pinnedBytes is what the pinned images take, each counted once.
func pinnedBytes(s *fakeStore) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total uint64
	counted := map[string]bool{}
	for _, r := range s.records {
		if r.Labels[PinLabel] == PinValue && !counted[r.Target.Digest] {
			counted[r.Target.Digest] = true
			img := s.images[r.Target.Digest]
			total += img.size + img.unpacked
		}
	}
	return total
}

// markedBy reports whether any record carries the instance's mark.
func markedBy(s *fakeStore, ns, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if r.Labels[MarkKey(ns, name)] != "" {
			return true
		}
	}
	return false
}

// Issue 48, finding 4: one budget per node, whatever the instances. Two
// instances naming different budgets (the smallest, 550, wins) sync one
// after the other or at the same time, again and again: the pins never
// take more than the node's budget once both syncs are done, and neither
// is left without pins. Before, syncs at once pinned 900 bytes against
// 550, and the instance with the larger budget made the other drop all
// its pins.
func TestOneBudgetPerNode(t *testing.T) {
	const (
		refE = "docker.io/library/e:1"
		refF = "docker.io/library/f:1"
		refG = "docker.io/library/g:1"
	)
	tests := []struct {
		name       string
		concurrent bool
		latency    time.Duration
	}{
		{name: "one after the other"},
		{name: "at the same time", concurrent: true},
		{name: "at the same time, slow updates", concurrent: true, latency: time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := newFakeStore()
			s.setLatency = tt.latency
			s.add("dA", 100, 200, refA) // 300 on disk
			s.add("dE", 50, 100, refE)  // 150
			s.add("dF", 100, 150, refF) // 250
			s.add("dG", 50, 100, refG)  // 150
			one, two := newPinner(s, "ns", "one", 1000), newPinner(s, "ns", "two", 550)
			oneList := []pull.Result{present(refA), present(refE)}
			twoList := []pull.Result{present(refF), present(refG)}
			for round := range 20 {
				if tt.concurrent {
					var wg sync.WaitGroup
					wg.Go(func() { one.Sync(ctx, oneList) })
					wg.Go(func() { two.Sync(ctx, twoList) })
					wg.Wait()
				} else {
					one.Sync(ctx, oneList)
					two.Sync(ctx, twoList)
				}
				if n := pinnedBytes(s); n > 550 {
					t.Fatalf("round %d: the node's pins take %d bytes, over its budget of 550", round, n)
				}
			}
			if !markedBy(s, "ns", "one") || !markedBy(s, "ns", "two") {
				t.Errorf("one pins: %v, two pins: %v; want both to pin", markedBy(s, "ns", "one"), markedBy(s, "ns", "two"))
			}
		})
	}
}
