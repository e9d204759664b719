package cluster

import (
	"bytes"
	"fmt"
	"time"
)

// renderedRefresh is the watch flag of an instance rendered with
// refreshInterval: 1m, the shortest interval the function accepts.
const renderedRefresh = "--refresh-interval=1m0s"

// ShortenRefresh rewrites the watch container's refresh flag of manifests
// rendered with refreshInterval: 1m to interval. The function refuses
// intervals below a minute (each check reads the Node, on every node), but
// scenarios that wait for watch to notice a change cannot wait minutes: a
// speed-up for tests only, applied to the rendered output.
func ShortenRefresh(manifests []byte, interval time.Duration) ([]byte, error) {
	if !bytes.Contains(manifests, []byte(renderedRefresh)) {
		return nil, fmt.Errorf("the rendered DaemonSet has no %s: render with refreshInterval: 1m", renderedRefresh)
	}
	return bytes.ReplaceAll(manifests, []byte(renderedRefresh), []byte("--refresh-interval="+interval.String())), nil
}
