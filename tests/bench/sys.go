package bench

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// meminfo reads one /proc/meminfo field in bytes.
func meminfo(field string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != field {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n * 1024
	}
	return 0
}

func memAvailable() int64 { return meminfo("MemAvailable") }
func memTotal() int64     { return meminfo("MemTotal") }

// diskRoom refuses a run that the agents' disk ceiling would cut short.
// The nodes' containerd roots share this machine's filesystem, and an
// agent starts no pull once that filesystem is as full as its default
// ceiling, counted as the kubelet counts it (capacity - available, so the
// blocks reserved for root count as used: a disk df shows 40% used can be
// 78% used this way). Past it every node would be labeled failed,
// InsufficientDisk, and the run would measure nothing.
func diskRoom(u disk.Usage, need uint64) error {
	ceiling := disk.Ceiling{Percent: int(v1alpha1.DefaultDiskCeilingPercent)}
	limit := ceiling.Limit(u.CapacityBytes)
	if !u.Known() || u.UsedBytes()+need < limit {
		return nil
	}
	return fmt.Errorf("not enough disk for the nodes' images: they need about %s more on a filesystem already %s used of %s, "+
		"and the agents stop pulling at their %d%% disk ceiling (%s): free at least %s, or run fewer -nodes",
		disk.Bytes(need), disk.Bytes(u.UsedBytes()), disk.Bytes(u.CapacityBytes), ceiling.Percent, disk.Bytes(limit), disk.Bytes(u.UsedBytes()+need-limit))
}

// peakRSS is a process's peak resident set (VmHWM).
func peakRSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n * 1024
		}
	}
	return 0
}

// duBytes is the disk space the regular files under dir use, each
// hard-linked file counted once.
func duBytes(dir string) int64 {
	var total int64
	seen := map[uint64]bool{}
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*unix.Stat_t); ok {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
			total += st.Blocks * 512
			return nil
		}
		total += info.Size()
		return nil
	})
	return total
}

type cpuSample struct{ busy, total uint64 }

func readCPU() cpuSample {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return cpuSample{}
	}
	var s cpuSample
	for i, f := range fields[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		s.total += v
		if i != 3 && i != 4 { // idle, iowait
			s.busy += v
		}
	}
	return s
}

func cpuBusy(a, b cpuSample) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total)
}

func containerdVersion(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "containerd", "--version").Output()
	if err != nil {
		return "containerd (version unknown)"
	}
	// "containerd github.com/containerd/containerd 1.6.20~ds1 <commit>"
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return "containerd " + f[2]
	}
	return strings.TrimSpace(string(out))
}

// copyFiles copies the regular files of src into dst.
func copyFiles(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// MachineLoad is the machine's load average over 1, 5 and 15 minutes and
// when it was read, for a report: make bench and make scale load the whole
// machine, and so does anything else running.
func MachineLoad() string {
	at := time.Now().UTC().Format("2006-01-02 15:04 UTC")
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], ", ") + " on " + at
	}
	return "unknown on " + at
}
