// Package disk reads how full the node's image filesystem is, and keeps
// pulls below a ceiling on it.
//
// The kubelet acts on the same filesystem: its image garbage collection
// starts once it is imageGCHighThresholdPercent full (85% by default) and
// removes images, those never run first, until it is
// imageGCLowThresholdPercent full (80%); its eviction manager evicts pods
// once imagefs.available falls below 15%. A prefetch that fills the disk
// therefore deletes what it prefetched and takes the node's workloads down.
// The ceiling stops pulling before that.
//
// The CRI says where the images are (ImageFsInfo) and how many bytes they
// take, but not how large the filesystem is. statfs tells, with the
// figures the kubelet's GC and eviction use: of the mountpoint when it is
// mounted from the host (spec.disk.imageFilesystem), else of the agent's
// own root, which the runtime keeps on that filesystem (OwnRoot). The
// kubelet's stats summary (Reader.Kubelet) is the last source, for layouts
// where neither is.
package disk

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
)

// Runtime is the CRI call the package needs.
type Runtime interface {
	ImageFsInfo(ctx context.Context) ([]cri.Filesystem, error)
}

// Usage is the state of the image filesystem.
type Usage struct {
	// Mountpoint is where the runtime keeps its images.
	Mountpoint string
	// ImageBytes is what the images take by the runtime's count (CRI
	// used_bytes); zero when only statfs was read.
	ImageBytes uint64
	// CapacityBytes and AvailableBytes are the filesystem's, from statfs:
	// the numbers the kubelet's image GC and eviction go by. Both are zero
	// when statfs failed.
	CapacityBytes  uint64
	AvailableBytes uint64
	// ReadAt is when the kubelet's figures were read (they are read every
	// few seconds, not at each look); zero when statfs gave them at this
	// look.
	ReadAt time.Time
}

// Known reports whether the capacity is known.
func (u Usage) Known() bool { return u.CapacityBytes > 0 }

// UsedBytes is what is not available to unprivileged writers, as the
// kubelet counts it: blocks reserved for root count as used.
func (u Usage) UsedBytes() uint64 {
	if u.AvailableBytes > u.CapacityBytes {
		return 0
	}
	return u.CapacityBytes - u.AvailableBytes
}

// Percent is how full the filesystem is, computed as the kubelet's image
// GC does (100 - available*100/capacity, in integers), so that a ceiling
// of 80 compares with a GC threshold of 85 as the numbers say.
func (u Usage) Percent() int {
	if !u.Known() {
		return 0
	}
	return 100 - int(u.AvailableBytes*100/u.CapacityBytes)
}

// String reads as "/var/lib/containerd/...: 81% used (77.8 MiB of 96.0 MiB)".
func (u Usage) String() string {
	if !u.Known() {
		return fmt.Sprintf("%s: capacity unknown", u.Mountpoint)
	}
	return fmt.Sprintf("%s: %d%% used (%s of %s)", u.Mountpoint, u.Percent(), Bytes(u.UsedBytes()), Bytes(u.CapacityBytes))
}

// ErrCapacityUnknown is wrapped by Read and Stat when neither the kubelet
// nor statfs of the mountpoint told the capacity.
var ErrCapacityUnknown = errors.New("image filesystem capacity unknown")

// Reader reads the image filesystem's usage.
type Reader struct {
	Runtime Runtime
	// Statfs returns a filesystem's capacity and available bytes; statfs(2)
	// when nil.
	Statfs func(path string) (capacity, available uint64, err error)
	// Root reads the agent's own root filesystem when it lies on the
	// image filesystem; asked when statfs of the mountpoint fails (the
	// path is not mounted in the pod: the default). Nil: not asked.
	Root *OwnRoot
	// Kubelet returns the image filesystem's capacity and available bytes
	// as the kubelet's stats summary has them, and when it read them;
	// asked when neither statfs answers. It must not wait on the network:
	// it returns its last reading. Nil: not asked.
	Kubelet func(ctx context.Context) (capacity, available uint64, readAt time.Time, err error)
}

// Read asks the runtime where its images are and how many bytes they take
// (one CRI call), then reads the filesystem's capacity. When only the
// capacity is unknown, the Usage still holds the runtime's numbers and the
// error wraps ErrCapacityUnknown.
func (r Reader) Read(ctx context.Context) (Usage, error) {
	fss, err := r.Runtime.ImageFsInfo(ctx)
	if err != nil {
		return Usage{}, fmt.Errorf("image filesystem: %w", err)
	}
	// The kubelet, too, takes the first one: a runtime with its images on
	// several filesystems is not something it handles either.
	if len(fss) == 0 || fss[0].Mountpoint == "" {
		return Usage{}, fmt.Errorf("%w: the runtime reports no image filesystem mountpoint", ErrCapacityUnknown)
	}
	u, err := r.Stat(ctx, fss[0].Mountpoint)
	u.ImageBytes = fss[0].UsedBytes
	return u, err
}

// Stat reads the capacity of a known mountpoint, without asking the
// runtime, from the first source that answers: statfs of the mountpoint
// when it is mounted, statfs of the agent's own root when it lies there,
// the kubelet's last figures. The error wraps ErrFiguresLate when a
// source failed this time (a kubelet answering 500), rather than none
// being there at all (each wraps ErrNoSource).
func (r Reader) Stat(ctx context.Context, mountpoint string) (Usage, error) {
	statfs := r.Statfs
	if statfs == nil {
		statfs = Statfs
	}
	u := Usage{Mountpoint: mountpoint}
	var readAt time.Time
	capacity, avail, err := statfs(mountpoint)
	// Not mounted is the default, not a failure.
	late := false
	try := func(read func() (uint64, uint64, time.Time, error)) {
		if err == nil {
			return
		}
		c, a, at, serr := read()
		if serr == nil {
			capacity, avail, readAt, err = c, a, at, nil
			return
		}
		late = late || !errors.Is(serr, ErrNoSource)
		err = fmt.Errorf("%w; %w", serr, err)
	}
	if r.Root != nil {
		try(func() (uint64, uint64, time.Time, error) {
			c, a, err := r.Root.Figures(mountpoint)
			return c, a, time.Time{}, err
		})
	}
	if r.Kubelet != nil {
		try(func() (uint64, uint64, time.Time, error) { return r.Kubelet(ctx) })
	}
	if err != nil {
		if late {
			err = fmt.Errorf("%w: %w", ErrFiguresLate, err)
		}
		return u, fmt.Errorf("%w: %w (the sources: %s mounted from the host: spec.disk.imageFilesystem; "+
			"the agent's own root filesystem; the kubelet's stats summary)", ErrCapacityUnknown, err, mountpoint)
	}
	if capacity == 0 {
		return u, fmt.Errorf("%w: statfs %s reports a size of 0", ErrCapacityUnknown, mountpoint)
	}
	u.CapacityBytes, u.AvailableBytes, u.ReadAt = capacity, avail, readAt
	return u, nil
}

// ErrFiguresLate is wrapped by Read and Stat when a source of the figures
// failed this time but may answer on the next look.
var ErrFiguresLate = errors.New("the image filesystem's figures are late")

// Statfs returns the capacity and the bytes available to unprivileged
// writers of the filesystem holding path, as cAdvisor reports them to the
// kubelet.
func Statfs(path string) (capacity, available uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	bsize := uint64(st.Bsize)
	return st.Blocks * bsize, st.Bavail * bsize, nil
}

// Bytes formats a byte count with a binary unit: "512 B", "77.8 MiB".
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
