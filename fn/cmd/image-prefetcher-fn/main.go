// Command image-prefetcher-fn is a KRM function that expands an
// ImagePrefetcher into the objects that prefetch its images on every node.
// It reads a ResourceList on stdin and writes one on stdout.
package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

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
		files := &origins{dir: "."}
		for _, r := range results {
			if r.File == nil && r.ResourceRef != nil {
				if p := files.of(r.ResourceRef); p != "" {
					r.File = &framework.File{Path: p}
				}
			}
			fmt.Fprintf(stderr, "image-prefetcher-fn: %s\n", describe(r))
		}
		// The function cannot see the kustomization that includes a
		// Component, so it cannot tell whether that kustomization's patches
		// or namespace: will undo what it rendered.
		if file := componentKustomization("."); file != "" {
			fmt.Fprintf(stderr, "image-prefetcher-fn: error: declared in the kustomize Component %s: kustomize runs a Component's functions before the patches: and namespace: of the kustomization that includes it, so a patch of the ImagePrefetcher there would be lost and a namespace: there would move the agent away from its admission policy; list the function under transformers: of the kustomization that includes the Component instead (docs/integrations/kustomize.md#where-namespace-and-images-must-go)\n", file)
			return 1
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

// componentKustomization returns the kustomization file in dir when it is
// a kustomize Component, "" otherwise. kustomize runs an exec function in
// the directory of the kustomization that lists it, so that is where a
// function declared in a component finds out.
func componentKustomization(dir string) string {
	for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		var k struct {
			Kind string `yaml:"kind"`
		}
		if yaml.Unmarshal(b, &k) == nil && k.Kind == "Component" {
			abs, err := filepath.Abs(filepath.Join(dir, name))
			if err != nil {
				abs = name
			}
			return abs
		}
		return ""
	}
	return ""
}

// describe is the one-line, human-readable form of a result, for stderr:
// kustomize shows a failing function's stderr and nothing else.
func describe(r *framework.Result) string {
	var b strings.Builder
	b.WriteString(string(r.Severity))
	b.WriteString(": ")
	if ref := r.ResourceRef; ref != nil {
		b.WriteString(ref.Kind)
		b.WriteString(" ")
		if ref.Namespace != "" {
			b.WriteString(ref.Namespace + "/")
		}
		b.WriteString(cmp.Or(ref.Name, "(no name)"))
		if r.File != nil && r.File.Path != "" {
			fmt.Fprintf(&b, " (%s)", r.File.Path)
		}
		b.WriteString(": ")
	}
	if r.Field != nil && r.Field.Path != "" {
		b.WriteString(r.Field.Path + ": ")
	}
	b.WriteString(strings.ReplaceAll(r.Message, "\n", " "))
	return b.String()
}
