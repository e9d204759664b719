package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// ImageFs is a kubelet's account of its node's image filesystem, from its
// stats summary (node.runtime.imageFs): the figures its image GC and
// eviction read. UsedBytes there is what the images take; the
// filesystem's use, as the agent and `df` count it, is CapacityBytes -
// AvailableBytes.
type ImageFs struct {
	Time           time.Time `json:"time"`
	CapacityBytes  uint64    `json:"capacityBytes"`
	AvailableBytes uint64    `json:"availableBytes"`
	UsedBytes      uint64    `json:"usedBytes"`
}

// FsUsed is the filesystem's use: capacity less available.
func (f ImageFs) FsUsed() uint64 { return f.CapacityBytes - f.AvailableBytes }

// KubeletImageFs reads node's stats summary as the admin, through the
// apiserver's node proxy, until its image filesystem has a capacity and ok
// (nil: anything) holds for it, every 500 ms: the kubelet's figures follow
// the disk at its stats provider's pace. ctx bounds the wait.
func (c *Cluster) KubeletImageFs(ctx context.Context, node string, ok func(ImageFs) bool) (ImageFs, error) {
	cs, err := c.Clientset()
	if err != nil {
		return ImageFs{}, err
	}
	var fs ImageFs
	err = Poll(ctx, 500*time.Millisecond, node+"'s kubelet image filesystem stats", func() (bool, string) {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
		var summary struct {
			Node struct {
				Runtime struct {
					ImageFs ImageFs `json:"imageFs"`
				} `json:"runtime"`
			} `json:"node"`
		}
		if err := json.Unmarshal(raw, &summary); err != nil {
			return false, err.Error()
		}
		fs = summary.Node.Runtime.ImageFs
		return fs.CapacityBytes > 0 && (ok == nil || ok(fs)), fmt.Sprintf("%+v", fs)
	})
	return fs, err
}
