package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/pin"
)

// ImageStore is the node's image store: its runtime's root directory.
func (n *Node) ImageStore() string {
	if n.Runtime == CRIO {
		return filepath.Join(n.Dir, "crio", "storage")
	}
	return filepath.Join(n.Dir, "containerd")
}

// imageStoreMount is the holder's command that puts the runtime's root on
// a tmpfs of imageStoreBytes, or nothing.
func (n *Node) imageStoreMount() string {
	if n.imageStoreBytes <= 0 {
		return ""
	}
	return fmt.Sprintf("mkdir -p %[1]q\nmount -t tmpfs -o size=%[2]d,mode=711 ipf-image-store %[1]q", n.ImageStore(), n.imageStoreBytes)
}

// ImageStoreUsage is the image store's capacity and used bytes, counted as
// the kubelet counts them (blocks reserved for root are used), read in the
// node's mount namespace, where its tmpfs is.
func (n *Node) ImageStoreUsage() (capacity, used uint64, err error) {
	var st unix.Statfs_t
	path := filepath.Join(fmt.Sprintf("/proc/%d/root", n.holderPID), n.ImageStore())
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs of %s's image store: %w", n.Name, err)
	}
	bs := uint64(st.Bsize)
	return st.Blocks * bs, (st.Blocks - st.Bavail) * bs, nil
}

// PeakImageStoreUse samples the image store every 5 ms until stop is
// called, and returns the highest use it saw.
func (n *Node) PeakImageStoreUse() (stop func() uint64) {
	done := make(chan struct{})
	peak := make(chan uint64, 1)
	go func() {
		var max uint64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, used, err := n.ImageStoreUsage(); err == nil && used > max {
				max = used
			}
			select {
			case <-done:
				peak <- max
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		return <-peak
	}
}

// Image is the CRI's status of ref on the node: nil when the node lacks
// it. Pinned is what the kubelet's image GC reads.
func (n *Node) Image(ctx context.Context, ref string) (*runtimeapi.Image, error) {
	cri, err := n.CRI()
	if err != nil {
		return nil, err
	}
	defer cri.Close()
	resp, err := cri.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return nil, fmt.Errorf("%s: ImageStatus %s: %w", n.Name, ref, err)
	}
	return resp.GetImage(), nil
}

// HasImage reports whether the node's runtime has ref, through its CRI.
func (n *Node) HasImage(ctx context.Context, ref string) (bool, error) {
	img, err := n.Image(ctx, ref)
	return img != nil, err
}

// ImageLabels returns the labels of the containerd image record name (a
// normalized reference) in the CRI's namespace: the pin and the marks of
// the instances that pinned it, read through containerd's images API on
// the CRI socket as agent/pin writes them. Containerd nodes only.
func (n *Node) ImageLabels(ctx context.Context, name string) (map[string]string, error) {
	cri, err := n.CRI()
	if err != nil {
		return nil, err
	}
	defer cri.Close()
	rec, err := pin.NewContainerd(cri.conn).Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("%s: image record %s: %w", n.Name, name, err)
	}
	return rec.Labels, nil
}

// fillerName is the file FillImageStore writes at the image store's root,
// where neither containerd nor CRI-O looks.
const fillerName = ".ipf-filler"

// FillImageStore writes a file into the node's image store until the store
// is percent full as the kubelet counts it (capacity less available), as
// the other writers of an image filesystem (logs, other images) fill it
// on a real node; remove deletes the file. Only a store of the node's own
// (Options.ImageStoreBytes): never the host's disk.
func (n *Node) FillImageStore(percent int) (remove func() error, err error) {
	if n.imageStoreBytes <= 0 {
		return nil, fmt.Errorf("%s: fill the image store: it is the host's disk (set Options.ImageStoreBytes)", n.Name)
	}
	capacity, used, err := n.ImageStoreUsage()
	if err != nil {
		return nil, err
	}
	want := capacity / 100 * uint64(percent)
	if used >= want {
		return nil, fmt.Errorf("%s: fill the image store to %d%%: it holds %d of %d bytes already",
			n.Name, percent, used, capacity)
	}
	path := filepath.Join(fmt.Sprintf("/proc/%d/root", n.holderPID), n.ImageStore(), fillerName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: fill the image store: %w", n.Name, err)
	}
	// Allocated, not sparse: the blocks count as used.
	err = unix.Fallocate(int(f.Fd()), 0, 0, int64(want-used))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	remove = func() error { return os.Remove(path) }
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: fill the image store with %d bytes: %w", n.Name, want-used, err), remove())
	}
	return remove, nil
}
