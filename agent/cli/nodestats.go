package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// nodeFiguresGetter is implemented by clients that can reach a node's
// kubelet with their own credentials.
type nodeFiguresGetter interface {
	NodeFigures(ctx context.Context, node string) *kube.NodeFigures
}

// kubeletImageFs returns the kubelet source of the image filesystem's
// figures (docs/agent.md, "Node figures"), or nil when it is off
// (--kubelet-stats=false) or the agent has no API client that can reach
// it. It answers from the last reading, read in the background and asked
// again with backoff for the life of the process: a kubelet or apiserver
// that fails now gives figures once it answers.
func (a *agent) kubeletImageFs(ctx context.Context) func(context.Context) (uint64, uint64, time.Time, error) {
	g, ok := a.kube.(nodeFiguresGetter)
	if !ok || a.flags.nodeName == "" || !a.flags.kubeletStats {
		return nil
	}
	f := g.NodeFigures(ctx, a.flags.nodeName)
	return func(context.Context) (uint64, uint64, time.Time, error) {
		fs, err := f.ImageFs()
		if errors.Is(err, kube.ErrNoKubeletStats) {
			err = fmt.Errorf("%w: %w", disk.ErrNoSource, err)
		}
		return fs.CapacityBytes, fs.AvailableBytes, fs.ReadAt, err
	}
}
