package bench

import (
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
)

func TestDiskRoom(t *testing.T) {
	const GiB = 1 << 30
	need := (&Options{Nodes: 12, ImageSizes: []int64{227 << 20}}).diskNeed()
	if need != 12*454<<20 {
		t.Fatalf("diskNeed = %d, want 12 nodes × 2 × 227 MiB", need)
	}
	for _, tc := range []struct {
		name                string
		capacity, available uint64
		want                string // "" for no error
	}{
		// The machine whose first bench re-run had every node labeled
		// failed: 252 GiB, 55 GiB available, 40% used by df.
		{"78% used as the kubelet counts it", 252 * GiB, 55 * GiB, "free at least 737.6 MiB"},
		{"the same after freeing 14 GiB", 252 * GiB, 69 * GiB, ""},
		{"exactly at the ceiling", 100 * GiB, 20*GiB + need, "free at least 0 B"},
		{"one byte under it", 100 * GiB, 20*GiB + need + 1, ""},
		{"statfs failed", 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := diskRoom(disk.Usage{CapacityBytes: tc.capacity, AvailableBytes: tc.available}, need)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("diskRoom: %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("diskRoom: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
