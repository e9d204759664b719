package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeFigures keeps the last image filesystem figures of one node's
// kubelet, read in the background, so that asking never waits on the
// network: a kubelet port that drops packets (a default-deny egress
// policy, a host firewall) delays no pull and no label write. A failed
// read, or a failed Get of the Node that tells where the kubelet is, is
// tried again with backoff for the life of the process.
type NodeFigures struct {
	// MaxAge is how long a reading is used before the next is asked for:
	// the kubelet refreshes its figures every few seconds.
	MaxAge time.Duration
	// MaxStale is how long the last reading is used while the next ones
	// fail; after that the figures are unknown.
	MaxStale time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed read.
	MinBackoff, MaxBackoff time.Duration

	ctx     context.Context
	connect func(ctx context.Context) (*KubeletStats, error)

	mu      sync.Mutex
	stats   *KubeletStats
	last    ImageFs
	err     error
	busy    bool
	next    time.Time
	backoff time.Duration
}

// errNoReadingYet is the figures' error before the first read ended.
var errNoReadingYet = errors.New("kubelet stats: no reading yet")

// errStale is the figures' error when the last reading is too old and the
// next has not ended.
var errStale = errors.New("kubelet stats: the last reading is too old, the next one is under way")

// NewNodeFigures reads through connect, which finds the kubelet. Reads
// run under ctx: they end with it.
func NewNodeFigures(ctx context.Context, connect func(context.Context) (*KubeletStats, error)) *NodeFigures {
	return &NodeFigures{
		MaxAge: 2 * time.Second, MaxStale: 10 * time.Second,
		MinBackoff: time.Second, MaxBackoff: 30 * time.Second,
		ctx: ctx, connect: connect, err: errNoReadingYet,
	}
}

// NodeFigures reads the figures of node's kubelet: the Node (get nodes,
// which the agent has) tells its address and port.
func (c *Client) NodeFigures(ctx context.Context, node string) *NodeFigures {
	return NewNodeFigures(ctx, func(ctx context.Context) (*KubeletStats, error) {
		n, err := c.Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get node %s: %w", node, err)
		}
		return NewKubeletStats(c.cfg, n)
	})
}

// ImageFs returns the last reading, and starts the next read in the
// background when it is due. It never waits on the kubelet.
func (f *NodeFigures) ImageFs() (ImageFs, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if !f.busy && !now.Before(f.next) {
		f.busy = true
		go f.refresh()
	}
	if at := f.last.ReadAt; !at.IsZero() && now.Sub(at) < f.MaxStale {
		return f.last, nil
	}
	if f.err == nil {
		// Not asked for a while (between two checks): the read just
		// started gives the figures.
		return ImageFs{}, errStale
	}
	return ImageFs{}, f.err
}

func (f *NodeFigures) refresh() {
	f.mu.Lock()
	k := f.stats
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(f.ctx, 15*time.Second)
	defer cancel()
	var fs ImageFs
	var err error
	if k == nil {
		k, err = f.connect(ctx)
	}
	if err == nil {
		fs, err = k.Read(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.busy = false
	if err == nil {
		fs.ReadAt = time.Now()
		f.stats, f.last, f.err, f.backoff = k, fs, nil, 0
		f.next = fs.ReadAt.Add(f.MaxAge)
	} else {
		f.stats, f.err = k, err
		f.backoff = min(max(2*f.backoff, f.MinBackoff), f.MaxBackoff)
		f.next = time.Now().Add(f.backoff)
	}
}
