package cluster_test

import (
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// `make runtimes` builds the versions the harness looks for.
func TestRuntimeVersionsMatchTheMakefile(t *testing.T) {
	data, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"CONTAINERD_VERSION": cluster.Containerd2Version, "CRIO_VERSION": cluster.CRIOVersion} {
		m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(\S+)`).FindSubmatch(data)
		if m == nil || string(m[1]) != want {
			t.Errorf("Makefile %s = %q, harness wants %s", name, m, want)
		}
	}
}

// A missing runtime fails start-up at once, naming `make runtimes`.
func TestStartNamesMissingRuntimes(t *testing.T) {
	t.Setenv("RUNTIMES_DIR", t.TempDir())
	_, err := cluster.Start(context.Background(), cluster.Options{
		Nodes: 1, NodeRuntime: func(int) cluster.Runtime { return cluster.CRIO },
		KubeBinDir: t.TempDir(), BaseDir: t.TempDir(), Progress: io.Discard,
	})
	if err == nil || !strings.Contains(err.Error(), "make runtimes") {
		t.Fatalf("start without CRI-O: %v, want an error naming make runtimes", err)
	}
}
