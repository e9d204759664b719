package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stop tears the cluster down and removes everything the run created:
// processes, containers, mounts, cgroups, CNI results, the network
// namespace, the state directory, and the kernel sysctls the kubelet
// changed. It is safe to call more than once.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.attached {
		return errors.New("an attached cluster is stopped by its owner: use `cluster down`")
	}
	c.progress("tearing down")
	var errs []error
	// Kubelets first, so that nothing restarts the pods being removed.
	for _, n := range c.nodes {
		if p := c.proc(n.Name + "/kubelet"); p != nil {
			p.stop(10 * time.Second)
		}
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		if p := c.proc(name); p != nil {
			p.stop(10 * time.Second)
		}
	}
	// Nodes side by side: each waits on its own runtime.
	nodeErrs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			nodeErrs[i] = n.removePods(ctx)
			if p := c.proc(n.runtimeProcName()); p != nil {
				p.stop(10 * time.Second)
			}
		})
	}
	wg.Wait()
	errs = append(errs, nodeErrs...)
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if p := c.proc(name); p != nil {
			p.stop(10 * time.Second)
		}
	}
	if c.regStop != nil {
		c.regStop()
		c.regStop = nil
	}
	for _, n := range c.nodes {
		if p := c.proc(n.Name + "/holder"); p != nil {
			p.stop(2 * time.Second)
		}
	}
	if keep := os.Getenv("IMAGE_PREFETCHER_E2E_LOGS"); keep != "" {
		if err := copyDir(c.path("logs"), filepath.Join(keep, c.ID)); err != nil {
			errs = append(errs, err)
		} else {
			c.progress("logs kept in %s", filepath.Join(keep, c.ID))
		}
	}
	if err := destroy(c.snapshot()); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("teardown of run %s: %w", c.ID, err)
	}
	c.progress("torn down")
	return nil
}

// Destroy tears down the run in dir without its owner process: for `cluster
// down` and for runs whose owner crashed. Processes are killed, not asked.
func Destroy(dir string) error {
	s, err := readState(dir)
	if err != nil {
		// A run that failed before writing state holds nothing but files.
		return os.RemoveAll(dir)
	}
	return destroy(s)
}

// destroy is the part of teardown that needs no live process handles. It
// kills whatever is left, by membership rather than by remembered pid, so
// that containers and shims the harness never started are found too.
func destroy(s state) error {
	var errs []error
	if err := killLeftovers(s); err != nil {
		errs = append(errs, err)
	}
	for _, n := range s.Nodes {
		if err := removeCgroups(n.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
		if err := removeCNIResults(n.CNINetwork); err != nil {
			errs = append(errs, err)
		}
	}
	if s.NetNS != "" {
		if err := (&NetNS{Path: s.NetNS}).remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountUnder(s.Dir); err != nil {
		errs = append(errs, err)
	}
	if len(s.Sysctls) > 0 {
		if err := restoreSysctls(s.Dir, s.Sysctls); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove run directory: %w", err))
	}
	// The base directory goes too once the last run is gone.
	_ = os.Remove(filepath.Dir(s.Dir))
	return errors.Join(errs...)
}

// members finds the processes that belong to the run: inside its network
// namespace (every component and shim), inside a node's mount namespace, or
// in a node's cgroup (containers, which have network namespaces of their
// own). A command line that merely mentions the run directory, such as a
// shell reading a log, is not enough.
func members(s state) []int {
	self := os.Getpid()
	var netIno uint64
	if s.NetNS != "" {
		if ino, err := (&NetNS{Path: s.NetNS}).Inode(); err == nil {
			netIno = ino
		}
	}
	mntNS := map[string]bool{}
	for _, n := range s.Nodes {
		if n.HolderPID > 0 && alive(n.HolderPID) {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.HolderPID)); err == nil {
				mntNS[l] = true
			}
		}
	}
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid == 1 {
			continue
		}
		if belongs(pid, s, netIno, mntNS) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func belongs(pid int, s state, netIno uint64, mntNS map[string]bool) bool {
	base := fmt.Sprintf("/proc/%d/", pid)
	if netIno != 0 {
		var st unix.Stat_t
		if unix.Stat(base+"ns/net", &st) == nil && st.Ino == netIno {
			return true
		}
	}
	if l, err := os.Readlink(base + "ns/mnt"); err == nil && mntNS[l] {
		return true
	}
	if len(s.Nodes) > 0 {
		if cg, err := os.ReadFile(base + "cgroup"); err == nil {
			for _, n := range s.Nodes {
				if n.CgroupRoot != "" && strings.Contains(string(cg), ":"+n.CgroupRoot+"/") {
					return true
				}
			}
		}
	}
	return false
}

func killLeftovers(s state) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		pids := members(s)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of run %s survive SIGKILL: %v", s.ID, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cgroupHierarchies lists the mounted cgroup v1 hierarchies (and the v2
// one of a hybrid layout).
func cgroupHierarchies() []string {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// removeCgroups removes root and everything below it, deepest first (cgroup
// directories can only be removed empty).
func removeCgroups(root string) error {
	if root == "" {
		return nil
	}
	var errs []error
	for _, h := range cgroupHierarchies() {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for range 20 {
				if err = unix.Rmdir(d); err == nil || err == unix.ENOENT {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeCNIResults deletes the results containerd's CNI library cached for
// this run's network in the host-wide /var/lib/cni.
func removeCNIResults(network string) error {
	if network == "" {
		return nil
	}
	dir := "/var/lib/cni/results"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), network+"-") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("remove CNI result: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount of the host's mount namespace below dir
// (deepest first); none should exist, but a crash can leave some.
func unmountUnder(dir string) error {
	if dir == "" {
		return nil
	}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Leftovers lists what a stopped cluster left behind: processes, mounts,
// cgroups, CNI results, the network namespace, the run directory, or
// sysctls not restored. Empty after a clean Stop.
func (c *Cluster) Leftovers() []string {
	s := c.snapshot()
	var out []string
	var procs []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), s.Dir+"/") {
			procs = append(procs, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	for name, pid := range s.Procs {
		if alive(pid) {
			procs = append(procs, fmt.Sprintf("%d (%s)", pid, name))
		}
	}
	for _, n := range s.Nodes {
		if alive(n.HolderPID) {
			procs = append(procs, fmt.Sprintf("%d (%s mount namespace holder)", n.HolderPID, n.Name))
		}
	}
	if len(procs) > 0 {
		out = append(out, "processes: "+strings.Join(procs, "; "))
	}
	if m, _ := mountsUnder(s.Dir); len(m) > 0 {
		out = append(out, "mounts: "+strings.Join(m, ", "))
	}
	if _, err := os.Lstat(s.Dir); err == nil {
		out = append(out, "run directory "+s.Dir)
	}
	if s.NetNS != "" {
		if _, err := os.Lstat(s.NetNS); err == nil {
			out = append(out, "network namespace file "+s.NetNS)
		}
	}
	for _, n := range s.Nodes {
		for _, h := range cgroupHierarchies() {
			if _, err := os.Stat(filepath.Join(h, n.CgroupRoot)); err == nil {
				out = append(out, "cgroup "+filepath.Join(h, n.CgroupRoot))
			}
		}
		if res, _ := filepath.Glob("/var/lib/cni/results/" + n.CNINetwork + "-*"); len(res) > 0 {
			out = append(out, "CNI results: "+strings.Join(res, ", "))
		}
	}
	if len(s.Sysctls) > 0 && !otherLiveRuns(s.Dir) {
		now, err := Sysctls()
		if err != nil {
			out = append(out, err.Error())
		}
		for k, v := range s.Sysctls {
			if now[k] != v {
				out = append(out, fmt.Sprintf("sysctl %s is %s, was %s", k, now[k], v))
			}
		}
	}
	return out
}

func otherLiveRuns(selfDir string) bool {
	runs, _ := Runs(filepath.Dir(selfDir))
	for _, r := range runs {
		if r.Dir != selfDir && r.OwnerAlive {
			return true
		}
	}
	return false
}

// copyDir copies the regular files of src into dst, for keeping logs.
func copyDir(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("keep logs: %w", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("keep logs: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return fmt.Errorf("keep logs: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			return fmt.Errorf("keep logs: %w", err)
		}
	}
	return nil
}
