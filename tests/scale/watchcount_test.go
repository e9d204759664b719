package scale

import (
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The watch events per waiting node per minute: the agents' own counts
// over the time they waited, whatever the order of the events.
func TestWatchPerWaiterMinute(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ev := func(d time.Duration, agent int, kind string, value string) event {
		return event{T: t0.Add(d).UnixNano(), Agent: agent, Kind: kind, Slot: 0, Value: value}
	}
	// Agent 0 waits 60 s and agent 1 120 s: 3 waiting minutes, and 30
	// events delivered to them.
	events := []event{
		ev(0, 0, evWait, ""),
		ev(0, 1, evWait, ""),
		ev(60*time.Second, 0, evHold, "3"),
		ev(70*time.Second, 0, evWatched, "10"),
		ev(120*time.Second, 1, evHold, "4"),
		ev(130*time.Second, 1, evWatched, "20"),
	}
	opts := Options{Capacity: 1, NodeCap: 1, Images: []Image{{Size: 1}}}
	run := analyze(Config{Nodes: 2, Slots: 1}, opts, t0, t0.Add(time.Minute), events, nil, faultTimes{})
	if run.WatchEvents != 30 || run.WaitingSeconds != 180 || run.WatchPerWaiterMinute() != 10 {
		t.Errorf("%d events over %.0f waiting seconds: %.2f per waiting node per minute; want 30, 180 and 10",
			run.WatchEvents, run.WaitingSeconds, run.WatchPerWaiterMinute())
	}
}

// A counting watch counts the events it delivers, and stops.
func TestCountingWatch(t *testing.T) {
	inner := watch.NewFake()
	var n atomic.Int64
	w := newCountingWatch(inner, &n)
	go func() {
		for range 5 {
			inner.Modify(&coordinationv1.Lease{})
		}
	}()
	for range 5 {
		<-w.ResultChan()
	}
	w.Stop()
	if _, open := <-w.ResultChan(); open {
		t.Error("the watch delivered after Stop")
	}
	if got := n.Load(); got != 5 {
		t.Errorf("counted %d events, want 5", got)
	}
}
