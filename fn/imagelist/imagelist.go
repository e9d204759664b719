// Package imagelist parses the image-list format shared by the function and
// the agent: one reference per line, blank lines and '#' comments ignored,
// CRLF and a UTF-8 BOM tolerated, duplicates dropped keeping the first.
//
// Both halves must agree byte for byte on what a list means, which is why
// this lives next to the API types and depends on nothing heavy.
package imagelist

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Entry is one distinct reference from a list, in the order first seen.
type Entry struct {
	// Line is the 1-based source line; 0 when the entry did not come from text.
	Line int
	// Ref is the reference exactly as written, trimmed of spaces and comments.
	Ref string
	// Normalized is the kubelet's form (docker.io/library/debian:latest),
	// empty when Err is set.
	Normalized string
	// Err is set when Ref does not follow the image-reference grammar.
	Err error
}

// Duplicate records a reference that was dropped because an earlier line
// named the same image.
type Duplicate struct {
	Line      int
	Ref       string
	FirstLine int
	FirstRef  string
}

// List is the result of parsing. Invalid references are kept as entries with
// Err set, so that callers can report them instead of losing them.
type List struct {
	Entries    []Entry
	Duplicates []Duplicate
}

// Parse reads a list. It never fails: every problem is attached to the entry
// it belongs to.
func Parse(text string) List {
	var b Builder
	b.AddText(text)
	return b.List()
}

// Builder accumulates references from several sources (an inline list, then
// a ConfigMap) while keeping one de-duplication scope across all of them.
type Builder struct {
	list List
	seen map[string]int // dedup key -> index into list.Entries
}

// AddText adds every reference in text, with line numbers relative to it.
func (b *Builder) AddText(text string) {
	text = strings.TrimPrefix(text, "\uFEFF")
	// A lone CR is a line break too (classic Mac endings); CRLF stays one break.
	text = strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n")
	for i, line := range strings.Split(text, "\n") {
		if c := strings.IndexByte(line, '#'); c >= 0 {
			line = line[:c]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		b.Add(i+1, line)
	}
}

// Add adds one reference; line is informational and may be 0.
func (b *Builder) Add(line int, ref string) {
	ref = strings.TrimSpace(ref)
	if b.seen == nil {
		b.seen = map[string]int{}
	}
	e := Entry{Line: line, Ref: ref}
	key := ref
	if n, err := Normalize(ref); err != nil {
		e.Err = err
	} else {
		e.Normalized = n
		key = n
	}
	if first, ok := b.seen[key]; ok {
		f := b.list.Entries[first]
		b.list.Duplicates = append(b.list.Duplicates, Duplicate{Line: line, Ref: ref, FirstLine: f.Line, FirstRef: f.Ref})
		return
	}
	b.seen[key] = len(b.list.Entries)
	b.list.Entries = append(b.list.Entries, e)
}

// List returns what was added so far.
func (b *Builder) List() List { return b.list }

// Invalid returns the entries whose reference is malformed.
func (l List) Invalid() []Entry {
	var out []Entry
	for _, e := range l.Entries {
		if e.Err != nil {
			out = append(out, e)
		}
	}
	return out
}

// Refs returns every entry's reference as written, in order.
func (l List) Refs() []string {
	out := make([]string, len(l.Entries))
	for i, e := range l.Entries {
		out[i] = e.Ref
	}
	return out
}

// Digest names the list by content: 16 hex digits of the sha256 of every
// entry's normalized reference (or the reference as written, for an invalid
// one), in order. The function renders it into the DaemonSet's pod template
// and the agent computes it from the list it read, so both sides compare
// lists by this one rule.
func (l List) Digest() string {
	h := sha256.New()
	for _, e := range l.Entries {
		ref := e.Normalized
		if ref == "" {
			ref = e.Ref
		}
		h.Write([]byte(ref + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Normalize returns the fully-qualified form the kubelet uses:
// "debian" becomes "docker.io/library/debian:latest"; a digest-pinned
// reference gets no tag added.
func Normalize(ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("empty image reference")
	}
	r, err := parseNormalized(ref)
	if err != nil && strings.Contains(ref, "${") {
		// Flux's postBuild.substitute and envsubst run on the rendered
		// output, after the function: it reads the variable as written.
		return "", fmt.Errorf("invalid image reference %q: %w; ${...} is a variable of a substitution that runs after the function "+
			"(Flux's postBuild.substitute, envsubst), so the function reads it as written: write the image in full, "+
			"or substitute before the function runs (docs/integrations.md)", ref, err)
	}
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return r.String(), nil
}

// PullAlways applies the kubelet's default pull-policy rule: a reference
// whose tag is "latest", or that has neither tag nor digest, is always
// pulled; anything else is pulled only if not present.
func PullAlways(ref string) bool {
	r, err := parseNormalized(ref)
	if err != nil {
		return false
	}
	if r.tag != "" {
		return r.tag == defaultTag
	}
	return r.digest == ""
}

// Host returns the registry host of a reference ("docker.io" for Docker Hub
// short names).
func Host(ref string) (string, error) {
	r, err := parseNormalized(ref)
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return r.domain, nil
}

// Spellings returns the repository of ref (no tag, no digest) in every
// way a pod's image field commonly writes it: the kubelet matches names
// as written, without normalizing them, so a Docker Hub repository is
// "busybox", "library/busybox", "docker.io/busybox" and
// "docker.io/library/busybox" to it. Other registries have one spelling.
func Spellings(ref string) ([]string, error) {
	r, err := parseNormalized(ref)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	if r.domain != defaultDomain {
		return []string{r.name()}, nil
	}
	out := []string{r.path, defaultDomain + "/" + r.path}
	if short, ok := strings.CutPrefix(r.path, officialPrefix); ok {
		out = append(out, short, defaultDomain+"/"+short)
	}
	return out, nil
}
