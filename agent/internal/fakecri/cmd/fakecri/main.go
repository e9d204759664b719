// Command fakecri serves the fake CRI on a socket, with the images given as
// arguments present, so that the agent binary can be run and measured
// without a container runtime.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

func main() {
	socket := flag.String("socket", "", "socket path (default: a temporary one, printed)")
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
	if err := s.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(s.Socket)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	s.Close()
}
