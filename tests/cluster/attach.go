package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Attach returns a handle on a run another process owns (for example one
// started by `cluster up`): its kubeconfig, network namespace, nodes and
// CRI sockets, and Push. It cannot stop or restart components.
func Attach(dir string) (*Cluster, error) {
	s, err := readState(dir)
	if err != nil {
		return nil, err
	}
	if !alive(s.OwnerPID) {
		return nil, fmt.Errorf("run %s: its owner process %d is gone; remove it with `cluster down %s`", s.ID, s.OwnerPID, s.ID)
	}
	c := &Cluster{ID: s.ID, Dir: s.Dir, Kubeconfig: s.Kubeconfig, NetNS: &NetNS{Path: s.NetNS}, procs: map[string]*proc{}, started: time.Now(), attached: true}
	c.opts.Progress = os.Stderr
	for i, n := range s.Nodes {
		c.nodes = append(c.nodes, &Node{c: c, Index: i, Name: n.Name, IP: nodeIP(i), CgroupRoot: n.CgroupRoot, CRISocket: n.CRISocket, Dir: filepath.Dir(filepath.Dir(n.CRISocket)), holderPID: n.HolderPID, cniNet: n.CNINetwork})
	}
	return c, nil
}

// FindRun resolves a run ID to its run; "" means the newest run started by
// `cluster up` (a detached one) whose owner is alive, so that test runs of
// other processes are never picked by default.
func FindRun(baseDir, id string) (Run, error) {
	runs, err := Runs(baseDir)
	if err != nil {
		return Run{}, err
	}
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		if id == "" && r.OwnerAlive && r.Detached || id != "" && r.ID == id {
			return r, nil
		}
	}
	if id == "" {
		return Run{}, errors.New("no running cluster (start one with `cluster up`)")
	}
	return Run{}, fmt.Errorf("no run %q under %s", id, baseDirOr(baseDir))
}

func baseDirOr(d string) string {
	if d == "" {
		return defaultBaseDir()
	}
	return d
}

// CleanStale destroys runs whose owner process is gone (a test that
// crashed or was killed), so that their processes, mounts and cgroups do
// not pile up. Runs that have not written their state yet are left alone
// unless they are old.
func CleanStale(ctx context.Context, baseDir string) ([]string, error) {
	runs, err := Runs(baseDir)
	if err != nil {
		return nil, err
	}
	var cleaned []string
	var errs []error
	for _, r := range runs {
		if r.OwnerAlive {
			continue
		}
		if r.OwnerPID == 0 {
			if fi, err := os.Stat(r.Dir); err == nil && time.Since(fi.ModTime()) < 10*time.Minute {
				continue
			}
		}
		if err := Destroy(r.Dir); err != nil {
			errs = append(errs, fmt.Errorf("clean stale run %s: %w", r.ID, err))
			continue
		}
		cleaned = append(cleaned, r.ID)
	}
	return cleaned, errors.Join(errs...)
}
