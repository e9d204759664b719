package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kubeletSysctls are the kernel settings the kubelet writes at start-up
// (setupKernelTunables, with protectKernelDefaults off). They are global,
// not per namespace. The last three often already hold the kubelet's value,
// but not on every host, so they are saved and restored all the same.
var kubeletSysctls = []string{
	"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory",
	"vm/panic_on_oom", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

type sysctlSaver struct{ saved map[string]string }

// saveSysctls records the values to restore on teardown. If another live
// run already changed them, its record of the originals is taken instead,
// so that whichever run ends last restores the real originals.
func saveSysctls(baseDir, selfDir string) (*sysctlSaver, error) {
	runs, _ := Runs(baseDir)
	for _, r := range runs {
		if r.Dir == selfDir || !r.OwnerAlive {
			continue
		}
		if s, err := readState(r.Dir); err == nil && len(s.Sysctls) > 0 {
			return &sysctlSaver{saved: s.Sysctls}, nil
		}
	}
	saved, err := Sysctls()
	if err != nil {
		return nil, err
	}
	return &sysctlSaver{saved: saved}, nil
}

// restoreSysctls writes the saved values back unless another live run
// still has kubelets (it restores them when it ends).
func restoreSysctls(selfDir string, saved map[string]string) error {
	runs, _ := Runs(filepath.Dir(selfDir))
	for _, r := range runs {
		if r.Dir != selfDir && r.OwnerAlive && len(r.Nodes) > 0 {
			return nil
		}
	}
	var errs []error
	for k, v := range saved {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		}
	}
	return errors.Join(errs...)
}

// Sysctls reads the current values of the sysctls the kubelet changes.
func Sysctls() (map[string]string, error) {
	out := map[string]string{}
	for _, k := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return nil, fmt.Errorf("read sysctl %s: %w", k, err)
		}
		out[k] = strings.TrimSpace(string(v))
	}
	return out, nil
}
