package v1alpha1

import (
	"strings"
	"testing"
)

// TestDaemonSetOfPod: the DaemonSet controller names pods with
// generateName "<daemonset>-", which the apiserver cuts to 58 characters
// before appending 5 random ones (k8s.io/apiserver's SimpleNameGenerator).
// The agent and the admission policy both derive the DaemonSet from that
// name: the whole name up to 57 characters, its first 58 (57 before a
// '-') above, never a character that is not the DaemonSet's, and two
// copies under different namePrefixes stay apart.
func TestDaemonSetOfPod(t *testing.T) {
	podOf := func(ds string) string {
		base := ds + "-"
		if len(base) > 58 {
			base = base[:58]
		}
		return base + "x7k2q"
	}
	long := "a-image-prefetcher-" + strings.Repeat("w", 50)
	for _, tc := range []struct{ ds, want string }{
		{"image-prefetcher-web", "image-prefetcher-web"},
		{"a-image-prefetcher-web", "a-image-prefetcher-web"},
		{strings.Repeat("d", 57), strings.Repeat("d", 57)},
		{strings.Repeat("d", 58), strings.Repeat("d", 58)},
		{strings.Repeat("d", 59), strings.Repeat("d", 58)},
		{strings.Repeat("d", 57) + "-x", strings.Repeat("d", 57)},
		{long, long[:58]},
		{"b" + long[1:], "b" + long[1:58]},
	} {
		if got := DaemonSetOfPod(podOf(tc.ds)); got != tc.want {
			t.Errorf("DaemonSet of pod %s: %q, want %q", podOf(tc.ds), got, tc.want)
		}
	}
	// Every length a DaemonSet name can have: the identity is the name
	// itself or a prefix of it, and the whole name up to 57 characters.
	for n := 1; n <= 253; n++ {
		ds := strings.Repeat("d", n)
		got := DaemonSetOfPod(podOf(ds))
		if !strings.HasPrefix(ds, got) || n <= 57 && got != ds || n > 57 && len(got) != 58 {
			t.Errorf("DaemonSet of %d characters: %q", n, got)
		}
	}
	if got := DaemonSetOfPod("agent"); got != "" {
		t.Errorf("a name too short for a DaemonSet's pod: %q, want none", got)
	}
}
