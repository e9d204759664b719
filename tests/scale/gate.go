package scale

import (
	"context"
	"log/slog"
	"strconv"
	"sync"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/metrics"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/agent/slots"
)

// newGate is an agent's herd-control gate as agent/cli composes it with
// metrics on (the slots' gate inside the metrics wrapper), reporting to
// the harness when the agent waits, holds, loses and releases a slot.
func newGate(spec agentsSpec, id agentID, leases kube.LeaseClient, m *metrics.Metrics, a *simAgent, log *slog.Logger) (pull.Gate, error) {
	g, err := slots.New(slots.Config{
		Client:    leases,
		Namespace: spec.Namespace,
		Instance:  spec.Instance,
		Slots:     spec.Slots,
		SeedNodes: spec.SeedNodes,
		SeedKey:   spec.SeedKey,
		Identity:  id.Pod,
		Logger:    log,
	})
	if err != nil {
		return nil, err
	}
	return m.Gate(&recordingGate{g: g, a: a}), nil
}

// recordingGate is the slots' gate (agent/cli's slotGate), reporting.
type recordingGate struct {
	g *slots.Gate
	a *simAgent
}

func (r *recordingGate) Hold(ctx context.Context) (pull.Slot, error) {
	r.a.emit(evWait, -1, "")
	r.a.waiting.Store(true)
	h, err := r.g.Hold(ctx)
	r.a.waiting.Store(false)
	if err != nil {
		if ctx.Err() == nil {
			r.a.emit(evFailed, -1, err.Error())
		}
		return nil, err
	}
	r.a.emit(evHold, h.Slot(), strconv.FormatInt(r.a.requests.Load(), 10))
	s := &recordedSlot{h: h, emit: r.a.emit, released: make(chan struct{})}
	go func() {
		select {
		case <-h.Lost():
			r.a.emit(evLost, h.Slot(), "")
		case <-s.released:
		}
	}()
	return s, nil
}

type recordedSlot struct {
	h        *slots.Holding
	emit     func(kind string, slot int, value string)
	once     sync.Once
	released chan struct{}
}

func (s *recordedSlot) Release() {
	s.once.Do(func() {
		s.emit(evRelease, s.h.Slot(), "")
		close(s.released)
		s.h.Release()
		s.emit(evReleased, s.h.Slot(), "")
	})
}

func (s *recordedSlot) Lost() <-chan struct{} { return s.h.Lost() }
