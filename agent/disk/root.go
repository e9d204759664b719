package disk

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
)

// ErrNoSource is wrapped by a figures source that cannot answer on this
// node at all (not mounted, not on the image filesystem, not authorized),
// as opposed to one that failed this time (a kubelet answering 500).
var ErrNoSource = errors.New("no such source on this node")

// OwnRoot reads the figures from the agent's own root filesystem. The
// runtime made it from the image, as a snapshot in the directory where it
// keeps its images (containerd's snapshotter, CRI-O's storage), so statfs
// of "/" in the agent's container is statfs of the image filesystem: the
// figures the kubelet's image GC and eviction go by, with no mount, token
// or kubelet call. It is used only when /proc/self/mountinfo shows that
// "/" does lie there; a snapshotter of its own devices (devmapper), a
// sandboxed runtime (gVisor, Kata) or a split image store do not.
type OwnRoot struct {
	// Mountinfo returns the mount table; /proc/self/mountinfo when nil.
	Mountinfo func() ([]byte, error)
	// Statfs is statfs(2) when nil.
	Statfs func(path string) (capacity, available uint64, err error)

	mu       sync.Mutex
	verified map[string]error
}

// Figures returns the capacity and available bytes of the image filesystem
// whose mountpoint the runtime reports, when the agent's root lies on it.
func (o *OwnRoot) Figures(mountpoint string) (capacity, available uint64, err error) {
	if err := o.verify(mountpoint); err != nil {
		return 0, 0, err
	}
	statfs := o.Statfs
	if statfs == nil {
		statfs = Statfs
	}
	return statfs("/")
}

// verify checks the mount table once per mountpoint: it does not change
// under a running container.
func (o *OwnRoot) verify(mountpoint string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err, ok := o.verified[mountpoint]; ok {
		return err
	}
	read := o.Mountinfo
	if read == nil {
		read = func() ([]byte, error) { return os.ReadFile("/proc/self/mountinfo") }
	}
	var err error
	if mi, rerr := read(); rerr != nil {
		err = fmt.Errorf("the agent's root filesystem: %w: %w", ErrNoSource, rerr)
	} else if why := RootOnImageFs(mi, mountpoint); why != "" {
		err = fmt.Errorf("the agent's root filesystem: %w: %s", ErrNoSource, why)
	}
	if o.verified == nil {
		o.verified = map[string]error{}
	}
	o.verified[mountpoint] = err
	return err
}

// RootOnImageFs tells, from a mount table, whether "/" is a snapshot in
// the image filesystem whose mountpoint the runtime reports: "" when it
// is, else why not.
//
// The layouts, with M the mountpoint:
//   - containerd (overlayfs, native): M is the snapshotter's root, and a
//     container's root is M/snapshots/<n>/fs.
//   - CRI-O (containers/storage): M is <root>/<driver>-images, and a
//     container's root is <root>/<driver>/<id>/diff (overlay) or
//     <root>/<driver>/dir/<id> (vfs).
//
// An overlay names its upper directory by its host path. A bind mount
// (vfs, native) names the directory by its path inside its own
// filesystem, which may be mounted anywhere above it: any tail of the
// store's path, then the driver's directory.
func RootOnImageFs(mountinfo []byte, mountpoint string) string {
	root, ok := rootMount(string(mountinfo))
	if !ok {
		return "no mount at / in the mount table"
	}
	store, first := path.Clean(mountpoint), "snapshots"
	if base := path.Base(store); strings.HasSuffix(base, "-images") {
		store, first = path.Dir(store), strings.TrimSuffix(base, "-images")
	}
	if root.fstype == "overlay" {
		upper := root.option("upperdir")
		if upper == "" || !path.IsAbs(upper) {
			return fmt.Sprintf("the root overlay names no absolute upper directory (%q)", upper)
		}
		if !strings.HasPrefix(path.Clean(upper), path.Join(store, first)+"/") {
			return fmt.Sprintf("the root overlay's upper directory %s is not in %s", upper, path.Join(store, first))
		}
		return ""
	}
	comps := strings.Split(strings.TrimPrefix(store, "/"), "/")
	for k := 0; k <= len(comps); k++ {
		prefix := path.Join(append([]string{"/"}, append(comps[len(comps)-k:], first)...)...) + "/"
		if strings.HasPrefix(root.root, prefix) {
			return ""
		}
	}
	return fmt.Sprintf("the root is %s %s of %s, not a directory in %s", root.fstype, root.root, root.source,
		path.Join(store, first))
}

type mount struct {
	root, fstype, source string
	super                []string
}

func (m mount) option(key string) string {
	for _, o := range m.super {
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v
		}
	}
	return ""
}

// rootMount is the last entry of a mountinfo table mounted at "/", the one
// on top (proc(5): id parent major:minor root mountpoint options
// [optional...] - fstype source super-options).
func rootMount(mountinfo string) (mount, bool) {
	var m mount
	found := false
	for line := range strings.Lines(mountinfo) {
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || unescape(f[4]) != "/" {
			continue
		}
		m = mount{root: unescape(f[3]), fstype: g[0], source: unescape(g[1]), super: strings.Split(unescape(g[2]), ",")}
		found = true
	}
	return m, found
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}
