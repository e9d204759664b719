package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// RuntimeOptions tune the containerds StartRuntimes brings up.
type RuntimeOptions struct {
	// MaxConcurrentDownloads is containerd's CRI max_concurrent_downloads:
	// how many blobs of one image it fetches at once. 0 keeps containerd's
	// default (3).
	MaxConcurrentDownloads int
	// Runtime is the runtime of every added node; empty is Containerd16.
	Runtime Runtime
	// ShortNameAliases are CRI-O's short-name aliases (CRIO only).
	ShortNameAliases map[string]string
	// ImageStoreBytes, when set, puts each runtime's root on a tmpfs of
	// that size in the node's mount namespace: an image filesystem small
	// enough to fill.
	ImageStoreBytes int64
}

// StartRuntimes adds n runtime-only nodes to a control-plane-only cluster
// (Options.Nodes == 0): each is a containerd with its own root, state
// directory and socket in its own mount namespace, configured exactly like a
// full node's, but with no kubelet, so that many of them fit on one machine.
// No Node objects are created; callers create what they need. The run's
// registry is started first if the cluster has none. Stop tears the
// runtimes down with the rest of the run.
func (c *Cluster) StartRuntimes(ctx context.Context, n int, opts RuntimeOptions) ([]*Node, error) {
	if c.attached {
		return nil, errors.New("runtimes can only be added by the run's owner")
	}
	if c.opts.Nodes != 0 {
		return nil, errors.New("StartRuntimes needs a control-plane-only cluster (Options.Nodes == 0)")
	}
	if err := checkRuntime(opts.Runtime); err != nil {
		return nil, err
	}
	if opts.MaxConcurrentDownloads > 0 && opts.Runtime != Containerd16 && opts.Runtime != "" {
		return nil, fmt.Errorf("MaxConcurrentDownloads is a containerd 1.6 setting, not %s's", opts.Runtime)
	}
	if c.registry == nil {
		if err := c.startRegistry(); err != nil {
			return nil, err
		}
	}
	first := len(c.Nodes())
	var added []*Node
	for i := first; i < first+n; i++ {
		node := &Node{
			c: c, Index: i, Name: NodeName(i), IP: nodeIP(i),
			CgroupRoot: fmt.Sprintf("/ipf-%s-%s", c.ID, NodeName(i)),
			Labels:     DefaultNodeLabels(i),
			Dir:        c.path(fmt.Sprintf("n%d", i+1)),
			cniNet:     fmt.Sprintf("ipf-%s-n%d", c.ID, i+1),
			Runtime:    opts.Runtime, ShortNameAliases: opts.ShortNameAliases,
			imageStoreBytes: opts.ImageStoreBytes,
		}
		node.setSocket()
		c.mu.Lock()
		c.nodes = append(c.nodes, node)
		c.mu.Unlock()
		if err := node.prepare(ctx); err != nil {
			return nil, fmt.Errorf("node %s: %w", node.Name, err)
		}
		if opts.MaxConcurrentDownloads > 0 {
			if err := node.setMaxConcurrentDownloads(opts.MaxConcurrentDownloads); err != nil {
				return nil, err
			}
		}
		if err := node.startContainerd(ctx); err != nil {
			return nil, fmt.Errorf("node %s: %w", node.Name, err)
		}
		added = append(added, node)
	}
	if err := c.writeState(); err != nil {
		return nil, err
	}
	for _, node := range added {
		if err := node.waitContainerd(ctx); err != nil {
			return nil, fmt.Errorf("node %s: %w", node.Name, err)
		}
	}
	c.progress("%d runtime-only node(s) ready", len(added))
	return added, nil
}

// setMaxConcurrentDownloads adds the setting to the CRI section of the
// node's containerd.toml.
func (n *Node) setMaxConcurrentDownloads(v int) error {
	p := filepath.Join(n.Dir, "containerd.toml")
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read containerd config: %w", err)
	}
	const section = "[plugins.\"io.containerd.grpc.v1.cri\"]\n"
	if !strings.Contains(string(data), section) {
		return fmt.Errorf("containerd config %s has no CRI section", p)
	}
	out := strings.Replace(string(data), section, fmt.Sprintf("%s  max_concurrent_downloads = %d\n", section, v), 1)
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	return nil
}

// ContainerdRoot is the node's containerd root directory (content store,
// snapshots, metadata).
func (n *Node) ContainerdRoot() string { return filepath.Join(n.Dir, "containerd") }

// ContainerdPID is the pid of the node's running containerd, 0 if none.
func (n *Node) ContainerdPID() int {
	if p := n.c.proc(n.runtimeProcName()); p != nil {
		if done, _ := p.exited(); !done {
			return p.pid()
		}
	}
	return 0
}

// RestartRuntimes stops the containerd of every given node and starts it
// again. With wipe, its root (every image, blob and snapshot) is deleted in
// between, so that the next pull starts from an empty node; without, the
// node keeps its images but drops every connection it had open.
func (c *Cluster) RestartRuntimes(ctx context.Context, nodes []*Node, wipe bool) error {
	// Stopping and waiting run in parallel; starts are sequential because
	// each one rewrites the run's state file.
	if err := eachNode(nodes, func(n *Node) error {
		if err := n.StopContainerd(ctx); err != nil {
			return err
		}
		if !wipe {
			return nil
		}
		if err := os.RemoveAll(n.ContainerdRoot()); err != nil {
			return fmt.Errorf("remove containerd root: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := n.startContainerd(ctx); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return eachNode(nodes, func(n *Node) error { return n.waitContainerd(ctx) })
}

func eachNode(nodes []*Node, fn func(*Node) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Go(func() {
			if err := fn(n); err != nil {
				errs[i] = fmt.Errorf("%s: %w", n.Name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
