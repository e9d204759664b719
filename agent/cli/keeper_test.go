package cli

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// Finding 4 of issue 27: a check still waiting one refresh interval after
// it found an image missing flips the label then, not at the keeper's
// next tick after that (up to 2.1 intervals).
func TestKeeperFlipsAboutOneIntervalAfterTheWaitBegan(t *testing.T) {
	const refresh = time.Second
	e := newEnv(t)
	flipped := make(chan time.Time, 10)
	e.kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		flipped <- time.Now()
		return false, nil, nil
	})
	owner := label.NewOwner(testNamespace, testInstance)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &agent{log: log, labeler: &label.Labeler{Nodes: clientset.Wrap(e.kube).Nodes(), Node: testNode, Key: testKey, Owner: &owner, Log: log},
		events: &events.Recorder{Log: log}}
	k := newKeeper(a)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k.begin()
	go k.repairWhileChecking(ctx, refresh)
	// The check finds the image missing a little after the keeper started,
	// and waits for a slot.
	time.Sleep(refresh * 3 / 10)
	began := time.Now()
	k.waiting([]pull.Result{{Image: "app:1", Normalized: "docker.io/library/app:1"}})
	at := <-flipped
	if late := at.Sub(began); late > refresh*14/10 {
		t.Errorf("the label said the image was missing %v after the wait began, want about one refresh interval (%v)", late, refresh)
	}
}
