// Package runtimes_test runs the agent against every container runtime its
// users run (docs/testing.md, the runtime matrix): Debian's containerd 1.6,
// containerd 2.x and CRI-O, built by `make runtimes`. One control-plane-only
// cluster (a real kube-apiserver) is shared by every case, with one
// runtime-only node per runtime and the fault-injecting registry
// (tests/registry). Each runtime's cases use repositories of their own, so
// the runtimes run side by side.
//
// TestErrorFixtures records the errors each runtime really returns into
// agent/pull/testdata/errors (go test -run TestErrorFixtures -update), and
// fails when a runtime's words no longer match them.
//
// Run with `make e2e`, or: go test -p 1 -v ./tests/runtimes/ (after `make
// build host-deps kube runtimes`).
package runtimes_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

var c *cluster.Cluster

func TestMain(m *testing.M) {
	if fi, err := os.Stat(agentBin()); err != nil || fi.Mode()&0o111 == 0 {
		fmt.Fprintf(os.Stderr, ">> runtimes: %s is missing: run `make build`\n", agentBin())
		os.Exit(1)
	}
	os.Exit(cluster.RunMain(m, cluster.Options{Nodes: 0}, &c))
}

func repoRoot() string {
	bin, err := cluster.ProjectBinDir()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(bin)
}

func agentBin() string { return filepath.Join(repoRoot(), "bin", "image-prefetcher") }

// node is one runtime of the matrix.
type node struct {
	rt   cluster.Runtime
	node *cluster.Node
}

// repo is the registry repository of one case on this runtime.
func (n *node) repo(kase string) string { return "m/" + string(n.rt) + "/" + kase }

// ref is how a runtime is asked for a case's image.
func (n *node) ref(kase, tag string) string {
	return cluster.RegistryAddr + "/" + n.repo(kase) + ":" + tag
}

var (
	nodesOnce sync.Once
	nodes     map[cluster.Runtime]*node
	nodesErr  error
)

// aliasedShortName is the short name CRI-O's registries.conf maps to the
// local registry (the kubelet-equivalent reference test).
const aliasedShortName = "app"

// aliasTarget is where that alias points.
const aliasTarget = cluster.RegistryAddr + "/aliased/app"

// setupNodes starts one runtime-only node per runtime, once.
func setupNodes(t *testing.T) map[cluster.Runtime]*node {
	t.Helper()
	if c == nil {
		t.Fatal("no cluster: TestMain did not start one")
	}
	nodesOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		nodes = map[cluster.Runtime]*node{}
		for _, rt := range runtimesUnderTest() {
			opts := cluster.RuntimeOptions{Runtime: rt}
			if rt == cluster.CRIO {
				opts.ShortNameAliases = map[string]string{aliasedShortName: aliasTarget}
			}
			added, err := c.StartRuntimes(ctx, 1, opts)
			if err != nil {
				nodesErr = fmt.Errorf("start %s: %w", rt, err)
				return
			}
			nodes[rt] = &node{rt: rt, node: added[0]}
		}
	})
	if nodesErr != nil {
		t.Fatal(nodesErr)
	}
	return nodes
}

// forEachRuntime runs f for every runtime as parallel subtests.
func forEachRuntime(t *testing.T, f func(t *testing.T, n *node)) {
	all := setupNodes(t)
	for _, rt := range runtimesUnderTest() {
		t.Run(string(rt), func(t *testing.T) {
			t.Parallel()
			f(t, all[rt])
		})
	}
}

// runtimesUnderTest is every runtime, or those named in
// $IMAGE_PREFETCHER_RUNTIMES (comma-separated, e.g. "cri-o"), to iterate on
// one while developing. `make test` leaves it unset.
func runtimesUnderTest() []cluster.Runtime {
	env := os.Getenv("IMAGE_PREFETCHER_RUNTIMES")
	if env == "" {
		return cluster.Runtimes
	}
	var out []cluster.Runtime
	for _, rt := range cluster.Runtimes {
		for _, name := range strings.Split(env, ",") {
			if strings.TrimSpace(name) == string(rt) {
				out = append(out, rt)
			}
		}
	}
	return out
}

func slug(s string) string { return strings.NewReplacer("/", "-", ":", "-").Replace(s) }
