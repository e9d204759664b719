package scale

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Watch events. Every simulated agent counts the events its own Lease
// watches deliver to it (bookmarks and errors included): an agent watches
// only while it waits for a slot, so the sum over the agents divided by
// the time they spent waiting is the watch events per waiting node per
// minute (Run.WatchPerWaiterMinute), counted, not timed. Each agent
// reports its count once, as it ends (evWatched).

// Watch is the faults client's Watch, counting what the watch delivers.
func (f faults) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := f.LeaseClient.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return newCountingWatch(w, f.watchEvents), nil
}

// countingWatch passes a watch's events on, counting each one delivered.
type countingWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func newCountingWatch(inner watch.Interface, n *atomic.Int64) *countingWatch {
	c := &countingWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(c.out)
		for ev := range inner.ResultChan() {
			select {
			case c.out <- ev:
				n.Add(1)
			case <-c.stop:
				return
			}
		}
	}()
	return c
}

func (c *countingWatch) ResultChan() <-chan watch.Event { return c.out }

func (c *countingWatch) Stop() {
	c.once.Do(func() {
		close(c.stop)
		c.inner.Stop()
	})
}

// reportWatched sends the agent's watch event count to the harness.
func (a *simAgent) reportWatched() {
	a.emit(evWatched, -1, strconv.FormatInt(a.watchEvents.Load(), 10))
}
