package disk

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

const mib = 1 << 20

type fakeRuntime struct {
	fss []cri.Filesystem
	err error
}

func (f fakeRuntime) ImageFsInfo(context.Context) ([]cri.Filesystem, error) { return f.fss, f.err }

func statfsOf(capacity, available uint64, err error) func(string) (uint64, uint64, error) {
	return func(string) (uint64, uint64, error) { return capacity, available, err }
}

func TestRead(t *testing.T) {
	const mp = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
	readAt := time.Now().Add(-3 * time.Second) // the kubelet's last reading
	tests := []struct {
		name        string
		rt          fakeRuntime
		statfs      func(string) (uint64, uint64, error)
		kubelet     func(context.Context) (uint64, uint64, time.Time, error)
		want        Usage
		wantErr     string
		wantUnknown bool
	}{
		{
			name:   "containerd",
			rt:     fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp, UsedBytes: 40 * mib}}},
			statfs: statfsOf(96*mib, 40*mib, nil),
			want:   Usage{Mountpoint: mp, ImageBytes: 40 * mib, CapacityBytes: 96 * mib, AvailableBytes: 40 * mib},
		},
		{
			name:   "the first of several, as the kubelet",
			rt:     fakeRuntime{fss: []cri.Filesystem{{Mountpoint: "/a", UsedBytes: 1}, {Mountpoint: "/b", UsedBytes: 2}}},
			statfs: statfsOf(100, 50, nil),
			want:   Usage{Mountpoint: "/a", ImageBytes: 1, CapacityBytes: 100, AvailableBytes: 50},
		},
		{
			name:        "not mounted into the pod: the runtime's numbers stay",
			rt:          fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp, UsedBytes: 7}}},
			statfs:      statfsOf(0, 0, fs.ErrNotExist),
			want:        Usage{Mountpoint: mp, ImageBytes: 7},
			wantErr:     mp + " mounted from the host",
			wantUnknown: true,
		},
		{
			name:    "not mounted: the kubelet's figures",
			rt:      fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp, UsedBytes: 7}}},
			statfs:  statfsOf(0, 0, fs.ErrNotExist),
			kubelet: func(context.Context) (uint64, uint64, time.Time, error) { return 96 * mib, 40 * mib, readAt, nil },
			want:    Usage{Mountpoint: mp, ImageBytes: 7, CapacityBytes: 96 * mib, AvailableBytes: 40 * mib, ReadAt: readAt},
		},
		{
			name:   "neither source: both causes",
			rt:     fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp, UsedBytes: 7}}},
			statfs: statfsOf(0, 0, fs.ErrNotExist),
			kubelet: func(context.Context) (uint64, uint64, time.Time, error) {
				return 0, 0, time.Time{}, errors.New("kubelet stats: 403 Forbidden")
			},
			want:        Usage{Mountpoint: mp, ImageBytes: 7},
			wantErr:     "403 Forbidden; file does not exist",
			wantUnknown: true,
		},
		{
			name:   "mounted: statfs, fresher than the kubelet",
			rt:     fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp}}},
			statfs: statfsOf(100, 50, nil),
			kubelet: func(context.Context) (uint64, uint64, time.Time, error) {
				t.Error("the kubelet is asked though statfs answered")
				return 0, 0, time.Time{}, nil
			},
			want: Usage{Mountpoint: mp, CapacityBytes: 100, AvailableBytes: 50},
		},
		{
			name:        "size 0",
			rt:          fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp}}},
			statfs:      statfsOf(0, 0, nil),
			want:        Usage{Mountpoint: mp},
			wantErr:     "size of 0",
			wantUnknown: true,
		},
		{
			name:        "no filesystem reported",
			rt:          fakeRuntime{},
			wantErr:     "no image filesystem mountpoint",
			wantUnknown: true,
		},
		{
			name:    "runtime error",
			rt:      fakeRuntime{err: errors.New("CRI ImageFsInfo: unavailable")},
			wantErr: "CRI ImageFsInfo: unavailable",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Reader{Runtime: tt.rt, Statfs: tt.statfs, Kubelet: tt.kubelet}.Read(context.Background())
			if got != tt.want {
				t.Errorf("Read() = %+v, want %+v", got, tt.want)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Read() error = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Read() error = %v, want one containing %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrCapacityUnknown) != tt.wantUnknown {
				t.Errorf("errors.Is(%v, ErrCapacityUnknown) = %v, want %v", err, !tt.wantUnknown, tt.wantUnknown)
			}
		})
	}
}

// The real statfs(2) of a real directory: what the agent reads in a pod.
func TestStatfs(t *testing.T) {
	capacity, avail, err := Statfs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if capacity == 0 || avail > capacity {
		t.Errorf("Statfs = capacity %d, available %d", capacity, avail)
	}
	if _, _, err := Statfs("/no/such/dir"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Statfs of a missing path: %v, want ErrNotExist", err)
	}
}

func TestPercent(t *testing.T) {
	tests := []struct {
		capacity, available uint64
		want                int
	}{
		{100, 100, 0},
		{100, 20, 80},
		// The kubelet's integer arithmetic: 20.5% available is 80% used.
		{1000, 205, 80},
		{1000, 199, 81},
		{100, 0, 100},
		{0, 0, 0},
	}
	for _, tt := range tests {
		u := Usage{CapacityBytes: tt.capacity, AvailableBytes: tt.available}
		if got := u.Percent(); got != tt.want {
			t.Errorf("Percent(capacity %d, available %d) = %d, want %d", tt.capacity, tt.available, got, tt.want)
		}
	}
}

func TestCeiling(t *testing.T) {
	const mp = "/var/lib/containers/storage/overlay-images"
	usage := func(capacity, available uint64) Usage {
		return Usage{Mountpoint: mp, CapacityBytes: capacity, AvailableBytes: available}
	}
	tests := []struct {
		name    string
		percent int
		usage   Usage
		wantErr string // "" when below the ceiling
	}{
		{name: "below", percent: 80, usage: usage(100*mib, 21*mib)},
		{name: "at", percent: 80, usage: usage(100*mib, 20*mib), wantErr: "the image filesystem is at or above its ceiling; " + mp + ": 80% used (80.0 MiB of 100.0 MiB), ceiling 80% (80.0 MiB)"},
		{name: "above", percent: 80, usage: usage(96*mib, 10*mib), wantErr: mp + ": 90% used (86.0 MiB of 96.0 MiB), ceiling 80% (76.8 MiB)"},
		{name: "100 stops only a full disk", percent: 100, usage: usage(100*mib, 1)},
		{name: "100, full", percent: 100, usage: usage(100*mib, 0), wantErr: "100% used"},
		{name: "capacity unknown", percent: 1, usage: Usage{Mountpoint: mp, ImageBytes: 50 * mib}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Ceiling{Percent: tt.percent}.Check(tt.usage)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check() = %v, want nil", err)
				}
				return
			}
			var full *FullError
			if !errors.As(err, &full) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check() = %v, want a *FullError containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestFullErrorCause(t *testing.T) {
	cause := errors.New("failed to copy: write /ingest/data: no space left on device")
	err := error(&FullError{Usage: Usage{Mountpoint: "/m", CapacityBytes: 96 * mib}, Ceiling: Ceiling{Percent: 80}, Cause: cause})
	want := "no space left on the image filesystem; /m: 100% used (96.0 MiB of 96.0 MiB), ceiling 80% (76.8 MiB): " + cause.Error()
	if err.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", err, want)
	}
	if !errors.Is(err, cause) {
		t.Error("FullError does not unwrap to its cause")
	}
}

func TestBytes(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{96 * mib, "96.0 MiB"},
		{3 << 30, "3.0 GiB"},
		{1 << 62, "4.0 EiB"},
	}
	for _, tt := range tests {
		if got := Bytes(tt.n); got != tt.want {
			t.Errorf("Bytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
