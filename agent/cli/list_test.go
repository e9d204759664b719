package cli

import (
	"testing"

	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

func TestLoadList(t *testing.T) {
	l := loadList("\uFEFFdebian\r\n# c\n\nDebian:1\ndocker.io/library/debian:latest # same\nquay.io/a/b:1\r", []string{"debian", "ghcr.io/x/y:2"})
	var got []string
	for _, e := range l.Entries {
		if e.Err != nil {
			got = append(got, "invalid:"+e.Ref)
			continue
		}
		got = append(got, e.Normalized)
	}
	want := []string{"docker.io/library/debian:latest", "invalid:Debian:1", "quay.io/a/b:1", "ghcr.io/x/y:2"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if len(l.Duplicates) != 2 {
		t.Errorf("duplicates %+v", l.Duplicates)
	}
}

// FuzzLoadList checks what the agent relies on: loading never panics, every
// valid entry is normalized to a fixed point, and no two entries are the
// same image.
func FuzzLoadList(f *testing.F) {
	f.Add("debian\nquay.io/a/b:1 # x\r\n", "busybox")
	f.Add("\uFEFFBad::Ref\n\n#\n", "")
	f.Add("a@sha256:0123456789012345678901234567890123456789012345678901234567890123", "a:latest")
	f.Fuzz(func(t *testing.T, text, arg string) {
		l := loadList(text, []string{arg})
		seen := map[string]bool{}
		for _, e := range l.Entries {
			if e.Err != nil {
				continue
			}
			n, err := imagelist.Normalize(e.Normalized)
			if err != nil || n != e.Normalized {
				t.Fatalf("%q normalizes to %q, then to %q (%v)", e.Ref, e.Normalized, n, err)
			}
			if seen[n] {
				t.Fatalf("%q listed twice", n)
			}
			seen[n] = true
		}
	})
}
