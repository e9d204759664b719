// Command fakecri serves the fake CRI on a socket, with the images given as
// arguments present, so that the agent binary can be run and measured
// without a container runtime.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

func main() {
	socket := flag.String("socket", "", "socket path (default: a temporary one, printed)")
	stall := flag.Bool("stall", false, "pulls block until the caller gives up, as on a registry that never answers")
	flag.Parse()
	s, err := fakecri.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *socket != "" {
		s.Socket = *socket
	}
	for _, ref := range flag.Args() {
		s.AddImage(ref, 1000)
	}
	if *stall {
		s.SetDefaultBehavior(func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error { return fakecri.Stall(ctx) })
	}
	if err := s.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(s.Socket)
	ch := make(chan os.Signal, 1)
	// SIGUSR1 removes every image, as image garbage collection would.
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	for sig := range ch {
		if sig != syscall.SIGUSR1 {
			break
		}
		s.DeleteAll()
	}
	s.Close()
}
