package runtimes_test

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// TestShortNameAliasOnCRIO: a list entry "app" is pulled from where a pod's
// `image: app` is, on real CRI-O whose registries.conf aliases app to the
// run's registry. The agent asks CRI-O for "app:latest", as the kubelet
// does, not for docker.io/library/app:latest, which CRI-O would fetch from
// Docker Hub (here: the registry's library/app, which does not exist).
func TestShortNameAliasOnCRIO(t *testing.T) {
	n := setupNodes(t)[cluster.CRIO]
	if n == nil {
		t.Fatal("no CRI-O node (IMAGE_PREFETCHER_RUNTIMES excludes cri-o)")
	}
	createNode(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	repo := aliasTarget[len(cluster.RegistryAddr)+1:]
	pushData(ctx, t, repo+":latest", 40)
	reg := c.Registry()

	res := runAgent(ctx, t, n, "short-name-alias", []string{aliasedShortName}, nil)
	if res.label != "succeeded" {
		t.Fatalf("label %q, annotation %s, want succeeded:\n%s", res.label, res.annotation, res.log)
	}
	if got := len(reg.Requests(registry.Match{Repo: repo, Kind: registry.Manifests})); got == 0 {
		t.Errorf("the alias target %s was never asked for its manifest", repo)
	}
	if got := reg.Requests(registry.Match{Repo: "library/app"}); len(got) != 0 {
		t.Errorf("the agent pulled docker.io/library/app, where pods' `image: app` does not come from: %v", got)
	}
	// What the kubelet checks before starting a pod with `image: app`.
	cri, err := n.node.CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	st, err := cri.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: aliasedShortName + ":latest"}})
	if err != nil || st.GetImage() == nil {
		t.Fatalf("CRI-O ImageStatus(app:latest) = %v, %v: the pods' image is not present", st.GetImage(), err)
	}
	t.Logf("app:latest on CRI-O is %v", st.GetImage().GetRepoTags())
}
