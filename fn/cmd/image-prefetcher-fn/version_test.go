package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kptdev/krm-functions-sdk/go/fn"
)

// TestVersionStampedAtBuild builds the function the way a release does,
// with the version set by the linker, and checks that the default agent
// image follows it. A change that reads the version before the linker's
// value applies (a const, a copy in another package's init) keeps the
// literal from fn/version and fails here, not in a release.
func TestVersionStampedAtBuild(t *testing.T) {
	const stamp = "9.9.9-test"
	bin := filepath.Join(t.TempDir(), "image-prefetcher-fn")
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X github.com/image-prefetcher/image-prefetcher/fn/version.Version="+stamp, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	if out, err := exec.Command(bin, "--version").Output(); err != nil || strings.TrimSpace(string(out)) != stamp {
		t.Errorf("--version: %q, %v; want %s", out, err, stamp)
	}

	cmd := exec.Command(bin)
	cmd.Stdin = strings.NewReader("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nfunctionConfig:\n" +
		indent(baseMeta+"spec:\n  images: [debian:bookworm]\n", "  "))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.Bytes())
	}
	rl, err := fn.ParseResourceList(out)
	if err != nil {
		t.Fatal(err)
	}
	const want = "ghcr.io/image-prefetcher/image-prefetcher:" + stamp
	var images []string
	for _, it := range rl.Items {
		if it.GetKind() != "DaemonSet" {
			continue
		}
		for _, list := range []string{"initContainers", "containers"} {
			cs, _, err := it.NestedSlice("spec", "template", "spec", list)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				images = append(images, c.GetString("image"))
			}
		}
	}
	if len(images) != 2 {
		t.Fatalf("want one DaemonSet with two containers, found images %q in\n%s", images, out)
	}
	for _, got := range images {
		if got != want {
			t.Errorf("agent image %q, want %q", got, want)
		}
	}
}
