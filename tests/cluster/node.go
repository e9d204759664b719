package cluster

import (
	"context"
	"errors"
	"fmt"
)

// Node is one kubelet with its own containerd.
type Node struct {
	c     *Cluster
	Index int
	// Name is the Node object's name.
	Name string
	// IP is the node's InternalIP inside the network namespace.
	IP string
	// CgroupRoot is the kubelet's cgroupRoot, below every hierarchy.
	CgroupRoot string
	// CRISocket is the path of containerd's socket as seen from the test
	// process (inside the node it is /run/containerd/containerd.sock).
	CRISocket string
	Labels    map[string]string
	dir       string
	holderPID int
	cniNet    string
}

// NodeName is the name of node i (0-based).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i+1) }

func nodeIP(i int) string { return fmt.Sprintf("10.200.0.%d", 11+i) }

func (n *Node) state() nodeState {
	return nodeState{Name: n.Name, CgroupRoot: n.CgroupRoot, HolderPID: n.holderPID, CRISocket: n.CRISocket, CNINetwork: n.cniNet}
}

func (c *Cluster) startNodes(ctx context.Context) error {
	return errors.New("nodes: not implemented yet")
}

func (n *Node) removePods(ctx context.Context) error { return nil }
