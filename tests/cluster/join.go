package cluster

import (
	"context"
	"errors"
	"fmt"
)

// JoinOptions describe a node that joins a running cluster, the way an
// autoscaler adds capacity.
type JoinOptions struct {
	// KubeletArgs are extra kubelet flags, for example
	// --register-with-taints=<key>=:NoSchedule.
	KubeletArgs []string
	// Labels are added to the node's default labels.
	Labels map[string]string
}

// AddNode starts one more node, containerd then kubelet, and returns once
// every node is Ready. The cluster must have been started with nodes and
// with Options.LateNodes left to use.
func (c *Cluster) AddNode(ctx context.Context, o JoinOptions) (*Node, error) {
	if c.opts.Nodes == 0 {
		return nil, errors.New("add node: the cluster runs the control plane only (Options.Nodes is 0)")
	}
	c.mu.Lock()
	i := len(c.nodes)
	if i >= c.opts.Nodes+c.opts.LateNodes {
		c.mu.Unlock()
		return nil, fmt.Errorf("add node: no late node left (Options.LateNodes is %d)", c.opts.LateNodes)
	}
	n := c.newNode(i, o.Labels)
	n.kubeletArgs = o.KubeletArgs
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	c.progress("%s: joining with kubelet flags %v", n.Name, o.KubeletArgs)
	if err := n.prepare(ctx); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := n.waitContainerd(ctx); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := c.WaitNodesReady(ctx); err != nil {
		return nil, err
	}
	return n, nil
}
