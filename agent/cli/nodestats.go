package cli

import (
	"context"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// kubeletImageFs returns the reader of the image filesystem's figures from
// this node's kubelet (docs/agent.md, "Node figures"), or nil when the
// agent has no API client that can reach it. A kubelet that cannot be
// reached now is asked again at each look: the reader is built once.
func (a *agent) kubeletImageFs(ctx context.Context) func(context.Context) (uint64, uint64, error) {
	g, ok := a.kube.(kube.KubeletStatsGetter)
	if !ok || a.flags.nodeName == "" {
		return nil
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	k, err := g.KubeletStats(gctx, a.flags.nodeName)
	if err != nil {
		a.log.Warn("cannot reach this node's kubelet for the image filesystem's figures; without spec.disk.imageFilesystem mounted, the pin budget and the disk ceiling are unknown", "err", err)
		return nil
	}
	return func(ctx context.Context) (uint64, uint64, error) {
		fs, err := k.ImageFs(ctx)
		return fs.CapacityBytes, fs.AvailableBytes, err
	}
}
