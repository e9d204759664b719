package disk

import (
	"context"
	"io/fs"

	"errors"
	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"strings"
	"testing"
)

// The mount tables are those of a container on each layout: the entries
// before "/" are the container's parents, as runc leaves them.
func TestRootOnImageFs(t *testing.T) {
	const (
		ctrd   = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
		k3s    = "/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs"
		crio   = "/var/lib/containers/storage/overlay-images"
		vfs    = "/var/lib/containers/storage/vfs-images"
		native = "/var/lib/containerd/io.containerd.snapshotter.v1.native"
	)
	overlay := func(upper string) string {
		return "1290 1180 0:312 / / ro,relatime master:511 - overlay overlay rw,lowerdir=/l/1/fs:/l/2/fs,upperdir=" +
			upper + ",workdir=/w/9/work,index=off\n" +
			"1291 1290 0:315 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
	}
	bind := func(fstype, root, source string) string {
		return "901 900 7:3 " + root + " / ro,relatime - " + fstype + " " + source + " rw,size=131072k\n"
	}
	tests := []struct {
		name       string
		mountinfo  string
		mountpoint string
		wantWhy    string // "" when "/" lies on the image filesystem
	}{
		{name: "containerd overlayfs", mountinfo: overlay(ctrd + "/snapshots/41/fs"), mountpoint: ctrd},
		{name: "k3s", mountinfo: overlay(k3s + "/snapshots/7/fs"), mountpoint: k3s},
		{name: "CRI-O overlay", mountinfo: overlay("/var/lib/containers/storage/overlay/3f1a/diff"), mountpoint: crio},
		{name: "CRI-O vfs, storage on the root filesystem",
			mountinfo: bind("ext4", "/var/lib/containers/storage/vfs/dir/3f1a", "/dev/vda"), mountpoint: vfs},
		{name: "CRI-O vfs, storage a filesystem of its own",
			mountinfo: bind("tmpfs", "/vfs/dir/3f1a", "ipf-image-store"), mountpoint: vfs},
		{name: "CRI-O vfs, /var/lib/containers a filesystem of its own",
			mountinfo: bind("xfs", "/storage/vfs/dir/3f1a", "/dev/sdb"), mountpoint: vfs},
		{name: "containerd native, containerd's root a filesystem of its own",
			mountinfo: bind("xfs", "/io.containerd.snapshotter.v1.native/snapshots/5", "/dev/sdb"), mountpoint: native},
		{name: "escaped path", mountinfo: overlay(`/data/my\040disk/overlay/3f1a/diff`),
			mountpoint: "/data/my disk/overlay-images"},
		{name: "upper directory elsewhere", mountinfo: overlay("/mnt/other/snapshots/41/fs"), mountpoint: ctrd,
			wantWhy: "is not in " + ctrd + "/snapshots"},
		{name: "CRI-O split image store: the container's layer is on another filesystem",
			mountinfo:  overlay("/var/lib/containers/storage/overlay/3f1a/diff"),
			mountpoint: "/mnt/imagestore/overlay-images", wantWhy: "not in /mnt/imagestore/overlay"},
		{name: "relative upper directory (long layer lists)", mountinfo: overlay("3f1a/diff"), mountpoint: crio,
			wantWhy: "no absolute upper directory"},
		{name: "devmapper: a device of its own", mountinfo: bind("ext4", "/", "/dev/mapper/containerd-pool-snap-12"),
			mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.devmapper", wantWhy: "not a directory in"},
		{name: "gVisor", mountinfo: "2 1 0:5 / / rw - 9p none rw,trans=fd\n", mountpoint: ctrd,
			wantWhy: "not a directory in"},
		{name: "a bind of another directory", mountinfo: bind("ext4", "/srv/rootfs", "/dev/vda"), mountpoint: vfs,
			wantWhy: "not a directory in"},
		{name: "no root", mountinfo: "1291 1290 0:315 / /proc rw - proc proc rw\n", mountpoint: ctrd,
			wantWhy: "no mount at /"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			why := RootOnImageFs([]byte(tt.mountinfo), tt.mountpoint)
			if tt.wantWhy == "" && why != "" || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("RootOnImageFs = %q, want %q", why, tt.wantWhy)
			}
		})
	}
}

// The agent's own root is the default source: statfs of "/" when the
// mount table puts it on the image filesystem, read once; no source
// (ErrNoSource, not a late one) when it does not.
func TestOwnRoot(t *testing.T) {
	const mp = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
	tables := 0
	root := &OwnRoot{
		Mountinfo: func() ([]byte, error) {
			tables++
			return []byte("1 0 0:31 / / ro - overlay overlay rw,upperdir=" + mp + "/snapshots/3/fs,workdir=/w\n"), nil
		},
		Statfs: func(p string) (uint64, uint64, error) {
			if p != "/" {
				t.Errorf("statfs %s, want /", p)
			}
			return 96 * mib, 40 * mib, nil
		},
	}
	r := Reader{Runtime: fakeRuntime{fss: []cri.Filesystem{{Mountpoint: mp, UsedBytes: 7}}},
		Statfs: statfsOf(0, 0, fs.ErrNotExist), Root: root}
	for range 3 {
		u, err := r.Read(context.Background())
		if err != nil || u.CapacityBytes != 96*mib || u.AvailableBytes != 40*mib {
			t.Fatalf("Read = %+v, %v; want the root's figures", u, err)
		}
	}
	if tables != 1 {
		t.Errorf("the mount table was read %d times, want once", tables)
	}
	_, err := Reader{Runtime: fakeRuntime{fss: []cri.Filesystem{{Mountpoint: "/elsewhere"}}},
		Statfs: statfsOf(0, 0, fs.ErrNotExist), Root: root}.Read(context.Background())
	if !errors.Is(err, ErrCapacityUnknown) || Transient(err) || !strings.Contains(err.Error(), "not in /elsewhere") {
		t.Errorf("Read on another filesystem = %v, want capacity unknown, no source", err)
	}
}
