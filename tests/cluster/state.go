package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
)

// state is what another process (`cluster down`, or a later run cleaning
// up after a crashed one) needs to tear a run down.
type state struct {
	ID         string            `json:"id"`
	Dir        string            `json:"dir"`
	OwnerPID   int               `json:"ownerPID"`
	Detached   bool              `json:"detached"`
	NetNS      string            `json:"netns"`
	Kubeconfig string            `json:"kubeconfig"`
	Procs      map[string]int    `json:"procs"`
	Nodes      []nodeState       `json:"nodes,omitempty"`
	Sysctls    map[string]string `json:"sysctls,omitempty"`
}

type nodeState struct {
	Name       string `json:"name"`
	CgroupRoot string `json:"cgroupRoot"`
	HolderPID  int    `json:"holderPID"`
	CRISocket  string `json:"criSocket"`
	CNINetwork string `json:"cniNetwork"`
}

func (c *Cluster) snapshot() state {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := state{ID: c.ID, Dir: c.Dir, OwnerPID: os.Getpid(), Detached: c.opts.Detached, Kubeconfig: c.Kubeconfig, Procs: map[string]int{}}
	if c.NetNS != nil {
		s.NetNS = c.NetNS.Path
	}
	for name, p := range c.procs {
		s.Procs[name] = p.pid()
	}
	for _, n := range c.nodes {
		s.Nodes = append(s.Nodes, n.state())
	}
	if c.sysctls != nil {
		s.Sysctls = c.sysctls.saved
	}
	return s
}

func (c *Cluster) writeState() error {
	s := c.snapshot()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode run state: %w", err)
	}
	tmp := filepath.Join(c.Dir, "state.json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write run state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(c.Dir, "state.json")); err != nil {
		return fmt.Errorf("write run state: %w", err)
	}
	return nil
}

func readState(dir string) (state, error) {
	var s state
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return s, fmt.Errorf("read run state: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("decode run state %s: %w", dir, err)
	}
	return s, nil
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}

// Run describes a run directory found under a base directory.
type Run struct {
	ID, Dir    string
	OwnerPID   int
	OwnerAlive bool
	Detached   bool
	Kubeconfig string
	NetNS      string
	Nodes      []string
}

// Runs lists the runs under baseDir ("" for the default), newest last.
func Runs(baseDir string) ([]Run, error) {
	if baseDir == "" {
		baseDir = defaultBaseDir()
	}
	entries, err := os.ReadDir(baseDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list runs: %w", err)
	}
	var runs []Run
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(baseDir, e.Name())
		s, err := readState(dir)
		if err != nil {
			runs = append(runs, Run{ID: e.Name(), Dir: dir})
			continue
		}
		r := Run{ID: s.ID, Dir: dir, OwnerPID: s.OwnerPID, OwnerAlive: alive(s.OwnerPID), Detached: s.Detached, Kubeconfig: s.Kubeconfig, NetNS: s.NetNS}
		for _, n := range s.Nodes {
			r.Nodes = append(r.Nodes, n.Name)
		}
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool {
		si, _ := os.Stat(runs[i].Dir)
		sj, _ := os.Stat(runs[j].Dir)
		if si == nil || sj == nil {
			return runs[i].ID < runs[j].ID
		}
		return si.ModTime().Before(sj.ModTime())
	})
	return runs, nil
}

func defaultBaseDir() string {
	if d := os.Getenv("IMAGE_PREFETCHER_E2E_DIR"); d != "" {
		return d
	}
	return "/tmp/ipf-e2e"
}
