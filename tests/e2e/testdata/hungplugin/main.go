// Command hungplugin is a kubelet credential-provider plugin that misbehaves
// the way real ones do: it starts a helper that inherits its stdout, then
// exits at once without answering. The helper keeps stdout open for ten
// minutes. An agent that waits for the pipe to close would hang that long.
package main

import (
	"io"
	"os"
	"os/exec"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hold" {
		time.Sleep(10 * time.Minute)
		return
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	child := exec.Command(os.Args[0], "hold")
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}
