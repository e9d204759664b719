package cli

import (
	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// progressOf is where the puller learns whether the runtime is still
// receiving image bytes, so that a pull attempt is cut only when none
// arrive (docs/agent.md, "Attempt timeouts and progress"): containerd's
// content API, on the CRI socket. CRI-O has no such API; its attempts keep
// plain deadlines.
func progressOf(runtimeName string, c *cri.Client) pull.Progress {
	if runtimeName != "containerd" {
		return nil
	}
	return c
}
