package imagelist

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		refs    []string
		invalid []string
		dups    []Duplicate
	}{
		{name: "empty", text: ""},
		{name: "comments and blanks", text: "# head\n\n  \nnginx:1.25 # trailing\n", refs: []string{"nginx:1.25"}},
		{name: "bom and crlf", text: "\uFEFFbusybox:1.36\r\nalpine:3.20\r\n", refs: []string{"busybox:1.36", "alpine:3.20"}},
		{name: "order kept", text: "b:1\na:1\nc:1", refs: []string{"b:1", "a:1", "c:1"}},
		{
			name: "duplicates keep first, by normalized name",
			text: "debian\nnginx:1\ndocker.io/library/debian:latest\nnginx:1\n",
			refs: []string{"debian", "nginx:1"},
			dups: []Duplicate{
				{Line: 3, Ref: "docker.io/library/debian:latest", FirstLine: 1, FirstRef: "debian"},
				{Line: 4, Ref: "nginx:1", FirstLine: 2, FirstRef: "nginx:1"},
			},
		},
		{name: "invalid kept as entry", text: "Bad::Ref\nok:1\n", refs: []string{"Bad::Ref", "ok:1"}, invalid: []string{"Bad::Ref"}},
		{name: "uppercase is invalid", text: "Nginx:1", refs: []string{"Nginx:1"}, invalid: []string{"Nginx:1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := Parse(tc.text)
			if got := l.Refs(); len(got)+len(tc.refs) > 0 && !reflect.DeepEqual(got, tc.refs) {
				t.Errorf("refs = %q, want %q", got, tc.refs)
			}
			var inv []string
			for _, e := range l.Invalid() {
				inv = append(inv, e.Ref)
				if e.Normalized != "" {
					t.Errorf("invalid entry %q has normalized form %q", e.Ref, e.Normalized)
				}
			}
			if !reflect.DeepEqual(inv, tc.invalid) {
				t.Errorf("invalid = %q, want %q", inv, tc.invalid)
			}
			if !reflect.DeepEqual(l.Duplicates, tc.dups) {
				t.Errorf("duplicates = %+v, want %+v", l.Duplicates, tc.dups)
			}
		})
	}
}

func TestBuilderSharesDedupAcrossSources(t *testing.T) {
	var b Builder
	b.Add(0, "nginx:1")
	b.AddText("busybox\nnginx:1\n")
	l := b.List()
	if got, want := l.Refs(), []string{"nginx:1", "busybox"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("refs = %q, want %q", got, want)
	}
	if len(l.Duplicates) != 1 || l.Duplicates[0].Line != 2 {
		t.Fatalf("duplicates = %+v", l.Duplicates)
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct{ in, want string }{
		{"debian", "docker.io/library/debian:latest"},
		{"debian:12", "docker.io/library/debian:12"},
		{"quay.io/org/app", "quay.io/org/app:latest"},
		{"127.0.0.1:5000/x/y:v1", "127.0.0.1:5000/x/y:v1"},
		{"ghcr.io/a/b@sha256:" + strings.Repeat("a", 64), "ghcr.io/a/b@sha256:" + strings.Repeat("a", 64)},
	}
	for _, tc := range tests {
		got, err := Normalize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "Bad::Ref", "org/Case", "a b", "x@sha256:short", "-lead"} {
		if _, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) succeeded, want error", bad)
		}
	}
}

// TestNormalizeSubstitutionHint: a ${VAR} left for a substitution that
// runs after the function gets a hint why it is not an image.
func TestNormalizeSubstitutionHint(t *testing.T) {
	for ref, hint := range map[string]bool{"${REGISTRY}/app:1": true, "registry.example.com/app:${TAG}": true, "Bad::Ref": false} {
		_, err := Normalize(ref)
		if err == nil || strings.Contains(err.Error(), "substitution that runs after the function") != hint {
			t.Errorf("Normalize(%q): %v, want the substitution hint: %t", ref, err, hint)
		}
	}
}

func TestPullAlways(t *testing.T) {
	digest := "@sha256:" + strings.Repeat("b", 64)
	tests := []struct {
		ref  string
		want bool
	}{
		{"debian", true},
		{"debian:latest", true},
		{"debian:12", false},
		{"debian" + digest, false},
		{"debian:12" + digest, false},
		{"debian:latest" + digest, true},
		{"Bad::Ref", false},
	}
	for _, tc := range tests {
		if got := PullAlways(tc.ref); got != tc.want {
			t.Errorf("PullAlways(%q) = %v, want %v", tc.ref, got, tc.want)
		}
	}
}

func TestHost(t *testing.T) {
	for in, want := range map[string]string{"debian": "docker.io", "127.0.0.1:5000/a:1": "127.0.0.1:5000", "quay.io/x/y": "quay.io"} {
		if got, err := Host(in); err != nil || got != want {
			t.Errorf("Host(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "\uFEFFa\r\nb # c\n", "Bad::Ref\n\n#x", "a@sha256:" + strings.Repeat("0", 64), "\x00\xff\n:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		l := Parse(text)
		seen := map[string]bool{}
		for _, e := range l.Entries {
			if e.Ref == "" || strings.ContainsAny(e.Ref, "#\r\n") {
				t.Fatalf("entry %q kept a blank, comment or line break", e.Ref)
			}
			if (e.Err == nil) == (e.Normalized == "") {
				t.Fatalf("entry %q: err=%v normalized=%q", e.Ref, e.Err, e.Normalized)
			}
			key := e.Normalized
			if key == "" {
				key = e.Ref
			}
			if seen[key] {
				t.Fatalf("duplicate entry %q", key)
			}
			seen[key] = true
		}
		// Parsing the kept references again must be a fixed point.
		again := Parse(strings.Join(l.Refs(), "\n"))
		if !reflect.DeepEqual(again.Refs(), l.Refs()) || len(again.Duplicates) != 0 {
			t.Fatalf("reparse changed the list: %q -> %q", l.Refs(), again.Refs())
		}
	})
}

// The kubelet's allowlist matches names as pods write them (agent/allowlist).
func TestSpellings(t *testing.T) {
	tests := []struct {
		ref  string
		want []string
	}{
		{"busybox:1.37", []string{"library/busybox", "docker.io/library/busybox", "busybox", "docker.io/busybox"}},
		{"index.docker.io/org/app@sha256:" + strings.Repeat("a", 64), []string{"org/app", "docker.io/org/app"}},
		{"ghcr.io/org/app:v1", []string{"ghcr.io/org/app"}},
		{"localhost:5000/app", []string{"localhost:5000/app"}},
	}
	for _, tt := range tests {
		got, err := Spellings(tt.ref)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Spellings(%q) = %v, %v; want %v", tt.ref, got, err, tt.want)
		}
	}
	if _, err := Spellings("Bad:ref:x"); err == nil {
		t.Error("an invalid reference was accepted")
	}
}
