package cluster

import (
	"strings"
	"testing"
)

func TestRoomError(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name                string
		capacity, available uint64
		wantErr             bool
	}{
		{"roomy", 100 * gib, 60 * gib, false},
		{"just below", 100 * gib, 22 * gib, false},
		{"at the limit", 100 * gib, 21 * gib, true},
		{"quota-limited, as on a shared host", 252 * gib, 50 * gib, true},
		{"unknown capacity", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := roomError("/tmp/ipf-e2e", tc.capacity, tc.available)
			if (err != nil) != tc.wantErr {
				t.Fatalf("roomError = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "IMAGE_PREFETCHER_E2E_DIR") {
				t.Errorf("the error does not say what to do: %v", err)
			}
		})
	}
}
