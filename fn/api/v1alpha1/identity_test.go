package v1alpha1

import (
	"strings"
	"testing"
)

// TestDaemonSetOfPod: the DaemonSet controller names pods with
// generateName "<daemonset>-", which the apiserver cuts to 58 characters
// before appending 5 random ones (k8s.io/apiserver's SimpleNameGenerator).
// The agent and the admission policy both derive the DaemonSet from that
// name: its first 57 characters at most, and two copies under different
// namePrefixes stay apart.
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
		{strings.Repeat("d", 58), strings.Repeat("d", 57)},
		{long, long[:57]},
		{"b" + long[1:], "b" + long[1:57]},
	} {
		if got := DaemonSetOfPod(podOf(tc.ds)); got != tc.want {
			t.Errorf("DaemonSet of pod %s: %q, want %q", podOf(tc.ds), got, tc.want)
		}
	}
	if got := DaemonSetOfPod("agent"); got != "" {
		t.Errorf("a name too short for a DaemonSet's pod: %q, want none", got)
	}
}
