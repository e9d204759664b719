package pin

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// One budget per node, whatever the instances. The rule:
//
//   - the node's budget is the smallest any instance on the node names;
//   - each instance claims a share of it, with the label
//     ClaimKey(namespace, name) = "budget=B,wants=W,reserve=R" on one
//     record of its list (the first present one): the budget it names,
//     what its present images would take within it, and what of them fits
//     in its share;
//   - the shares are max-min fair over the wants: an instance that wants
//     less than an equal part gets what it wants, the rest is split
//     equally among the others;
//   - an instance may pin what the node's budget leaves once every other
//     instance has the larger of what it pins and what it reserves; an
//     image several instances pin counts for the first of them by name;
//     an instance that claims nothing (an older agent) reserves nothing.
//
// So an instance keeps room for what the others can pin within their
// shares, uses what they leave, and gives back (at its next sync) what a
// newcomer reserves. Every instance computes the same figures from the
// same labels, so two never undo each other. Syncs that run at once
// converge: a claim is written before the listing the plan is made from,
// and an instance that pinned more lists again; if the node is then over
// its budget, the excess is given up by the instances past their reserve,
// the last by name first, as each of them computes alike. Of two
// instances, either the second's listing comes after the first's pins (it
// plans within what is left) or the first's listing after the second's
// claim and pins (it sees the excess).

// ClaimPrefix starts every instance's claim on the node's pin budget.
const ClaimPrefix = "image-prefetcher.stackrox.io/pin-claim."

// ClaimKey is the label by which the instance name of namespace ns claims
// its share of the node's pin budget.
func ClaimKey(ns, name string) string { return ClaimPrefix + ns + "." + name }

type claim struct{ budget, wants, reserve uint64 }

func (c claim) String() string {
	return fmt.Sprintf("budget=%d,wants=%d,reserve=%d", c.budget, c.wants, c.reserve)
}

func parseClaim(v string) (claim, bool) {
	var c claim
	if _, err := fmt.Sscanf(v, "budget=%d,wants=%d,reserve=%d", &c.budget, &c.wants, &c.reserve); err != nil {
		return claim{}, false
	}
	return c, true
}

// view is the node's pins and claims as one listing shows them.
type view struct {
	me     string // this instance, ns.name
	all    map[string]Record
	marked map[string]Record // this instance's, by name
	// markers holds the instances marking each image, by ID, sorted; size
	// its bytes. Images whose size cannot be read are left out: they went
	// meanwhile.
	markers map[string][]string
	size    map[string]uint64
	// claims are the other instances' claims, by instance.
	claims map[string]claim
}

// survey reads the node's pins and claims from one listing.
func (p *Pinner) survey(ctx context.Context) (*view, error) {
	list, err := p.Store.List(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list image records: %w", err)
	}
	v := &view{me: p.Namespace + "." + p.Name, all: make(map[string]Record, len(list)), marked: map[string]Record{},
		markers: map[string][]string{}, size: map[string]uint64{}, claims: map[string]claim{}}
	var theirs []Record
	for _, r := range list {
		v.all[r.Name] = r
		if r.Labels[p.mark()] != "" {
			v.marked[r.Name] = r
		}
		for k, val := range r.Labels {
			if inst, ok := strings.CutPrefix(k, ClaimPrefix); ok && inst != v.me {
				if c, ok := parseClaim(val); ok {
					v.claims[inst] = c
				}
			}
		}
		if slices.ContainsFunc(instancesMarking(r.Labels), func(i string) bool { return i != v.me }) {
			theirs = append(theirs, r)
		}
	}
	sizes := make([]imageSize, len(theirs))
	errs := make([]error, len(theirs))
	each(len(theirs), func(i int) { sizes[i], errs[i] = p.sizeOf(ctx, theirs[i]) })
	for i, sz := range sizes {
		if errs[i] != nil {
			p.log().Debug("the size of another instance's pin is unknown", "record", theirs[i].Name, "err", errs[i])
			continue
		}
		v.size[sz.id] = sz.bytes
		for _, inst := range instancesMarking(theirs[i].Labels) {
			if inst != v.me && !slices.Contains(v.markers[sz.id], inst) {
				v.markers[sz.id] = append(v.markers[sz.id], inst)
			}
		}
		slices.Sort(v.markers[sz.id])
	}
	return v, nil
}

// used is what each other instance pins: an image counts for the first of
// the instances marking it by name, this one included when it pins the
// image too (mine, by ID).
func (v *view) used(mine map[string]bool) map[string]uint64 {
	out := map[string]uint64{}
	for id, ms := range v.markers {
		if len(ms) == 0 || mine[id] && v.me < ms[0] {
			continue
		}
		out[ms[0]] += v.size[id]
	}
	return out
}

// cost is what pinning image id takes of this instance's room: nothing
// when another instance before it by name pins it too.
func (v *view) cost(id string, bytes uint64) uint64 {
	if ms := v.markers[id]; len(ms) > 0 && ms[0] < v.me {
		return 0
	}
	return bytes
}

// room is what this instance may pin: what the node's budget b leaves once
// every other instance has the larger of what it pins and what it
// reserves; mine are the images this instance pins, by ID.
func (v *view) room(b uint64, mine map[string]bool) uint64 {
	var taken uint64
	used := v.used(mine)
	for inst, n := range used {
		taken += max(n, v.claims[inst].reserve)
	}
	for inst, c := range v.claims {
		if _, ok := used[inst]; !ok {
			taken += c.reserve
		}
	}
	return b - min(taken, b)
}

// excess is what this instance, pinning own bytes (its costs) of the
// images mine, gives up when the node is over its budget b: the excess,
// taken from the instances past their reserve, the last by name first.
func (v *view) excess(own, reserve, b uint64, mine map[string]bool) uint64 {
	used := v.used(mine)
	used[v.me] = own
	var total uint64
	for _, n := range used {
		total += n
	}
	if total <= b {
		return 0
	}
	over := total - b
	insts := slices.Sorted(maps.Keys(used))
	for _, inst := range slices.Backward(insts) {
		r := v.claims[inst].reserve
		if inst == v.me {
			r = reserve
		}
		past := used[inst] - min(r, used[inst])
		give := min(over, past)
		if inst == v.me {
			return give
		}
		over -= give
	}
	return 0
}

// instancesMarking returns the instances (ns.name) whose marks labels hold.
func instancesMarking(labels map[string]string) []string {
	var out []string
	for k, val := range labels {
		if inst, ok := strings.CutPrefix(k, MarkPrefix); ok && val != "" {
			out = append(out, inst)
		}
	}
	return out
}

// nodeBudget is the smallest budget named on the node.
func (v *view) nodeBudget(own uint64) uint64 {
	b := own
	for _, c := range v.claims {
		b = min(b, c.budget)
	}
	return b
}

// share is this instance's max-min fair share of budget b, wanting wants,
// beside the other claims.
func (v *view) share(wants, b uint64) uint64 {
	type part struct {
		inst  string
		wants uint64
	}
	parts := []part{{v.me, min(wants, b)}}
	for inst, c := range v.claims {
		parts = append(parts, part{inst, min(c.wants, b)})
	}
	// Fewest wants first, then by name: the order every instance uses.
	slices.SortFunc(parts, func(x, y part) int {
		return cmp.Or(cmp.Compare(x.wants, y.wants), cmp.Compare(x.inst, y.inst))
	})
	left := b
	for i, pt := range parts {
		equal := left / uint64(len(parts)-i)
		got := min(pt.wants, equal)
		if pt.inst == v.me {
			return got
		}
		left -= got
	}
	return 0
}

// wants is what the items that can be pinned would take, in list order,
// within budget b: an image counted once, one that does not fit skipped.
func wants(items []*item, b uint64) uint64 {
	var total uint64
	counted := map[string]bool{}
	for _, it := range items {
		if it.err != nil || counted[it.sz.id] || total+it.sz.bytes > b {
			continue
		}
		counted[it.sz.id] = true
		total += it.sz.bytes
	}
	return total
}

// claim writes this instance's claim on the record of its first item that
// can be pinned, and removes it from any other record. It reports whether
// it wrote anything.
func (p *Pinner) claim(ctx context.Context, all map[string]Record, items []*item, c claim) (bool, error) {
	key := ClaimKey(p.Namespace, p.Name)
	at := ""
	if i := slices.IndexFunc(items, func(it *item) bool { return it.err == nil }); i >= 0 && c.wants > 0 {
		at = items[i].rec.Name
	}
	wrote := false
	var errs []error
	for name, r := range all {
		val, has := r.Labels[key]
		switch {
		case name == at && val != c.String():
			_, err := p.Store.SetLabels(ctx, r, map[string]string{key: c.String()})
			errs = append(errs, err)
			wrote = true
		case name != at && has:
			_, err := p.Store.SetLabels(ctx, r, map[string]string{key: ""})
			errs = append(errs, err)
			wrote = true
		}
	}
	for _, err := range errs {
		if err != nil {
			return wrote, fmt.Errorf("claim a share of the node's pin budget: %w", err)
		}
	}
	return wrote, nil
}

// unclaim removes this instance's claim from every record.
func (p *Pinner) unclaim(ctx context.Context) error {
	key := ClaimKey(p.Namespace, p.Name)
	list, err := p.Store.List(ctx, `labels."`+key+`"`)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range list {
		if _, err := p.Store.SetLabels(ctx, r, map[string]string{key: ""}); err != nil && !isNotFound(err) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove the claim on the node's pin budget: %w", errs[0])
	}
	return nil
}
