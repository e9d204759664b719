// Command image-prefetcher-fn is a KRM function that expands an
// ImagePrefetcher into the objects that prefetch its images on every node.
// It reads a ResourceList on stdin and writes one on stdout.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/image-prefetcher/image-prefetcher/fn/krm"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
)

func main() {
	os.Exit(run(os.Stdin, os.Stdout, os.Stderr, os.Args[1:]))
}

func run(stdin io.Reader, stdout, stderr io.Writer, args []string) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintln(stdout, version.Version)
		return 0
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "image-prefetcher-fn: unexpected arguments %q: the function reads a ResourceList on stdin\n", args)
		return 2
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "image-prefetcher-fn: read stdin: %v\n", err)
		return 1
	}
	out, results, by, err := krm.RunInvoked(in)
	if err != nil {
		fmt.Fprintf(stderr, "image-prefetcher-fn: %v\n", err)
		return 1
	}
	// kpt shows the results of every run; printing them again on stderr
	// would show each twice. kustomize shows only stderr.
	if by != krm.Kpt {
		for _, r := range results {
			fmt.Fprintf(stderr, "image-prefetcher-fn: %s\n", krm.Describe(r))
		}
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintf(stderr, "image-prefetcher-fn: write stdout: %v\n", err)
		return 1
	}
	if results.ExitCode() != 0 {
		return 1
	}
	return 0
}
