// Command image-prefetcher is the node agent: it pulls a list of images
// through the CRI and labels the node with the outcome.
package main

import (
	"context"
	"os"

	"github.com/image-prefetcher/image-prefetcher/agent/cli"
)

func main() {
	os.Exit(cli.Execute(context.Background(), os.Args[1:], cli.Deps{}))
}
