package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// joinerKinds are the lone joiners of a -join run, one after the other:
// whether the joiner's first Lease list is answered 503.
var joinerKinds = []bool{false, true}

// joinTimeout bounds one joiner, from its process's start to its label.
const joinTimeout = 3 * time.Minute

// Joiner is a node that joined alone after the herd was done: every node
// labeled and every slot free.
type Joiner struct {
	// FailedFirstList says that its first Lease list was answered 503
	// Service Unavailable, as an apiserver under load answers.
	FailedFirstList bool
	// Wait is from its agent's start to Hold returning a slot: all that
	// time every slot was free while a node waited.
	Wait time.Duration
	// Requests are the agent's API requests until then, the failed list
	// included.
	Requests int
	// Label is its node's label, read back from the API once its agent
	// ended.
	Label string
}

// joiners runs cfg's joiners, after the herd, one at a time, each with an
// index of its own after the herd's (so its own pod identity and pull
// time).
func (h *harness) joiners(ctx context.Context, cfg Config, logDir string) ([]Joiner, error) {
	var out []Joiner
	for k, failList := range joinerKinds {
		if err := h.slotsFree(ctx); err != nil {
			return out, err
		}
		i := cfg.Nodes + k
		id := h.ids[i]
		spec := h.spec(cfg)
		spec.FailFirstList = failList
		spec.Agents = []agentID{{Index: i, Node: id.Node, Pod: id.Pod, Token: id.Token}}
		jctx, cancel := context.WithTimeout(ctx, joinTimeout)
		events, err := h.runAlone(jctx, spec, filepath.Join(logDir, fmt.Sprintf("joiner-%d.log", k)))
		cancel()
		if err != nil {
			return out, fmt.Errorf("joiner %s: %w", id.Node, err)
		}
		j, err := joiner(events, failList)
		if err != nil {
			return out, fmt.Errorf("joiner %s: %w (see %s)", id.Node, err, logDir)
		}
		n, err := h.cs.CoreV1().Nodes().Get(ctx, id.Node, metav1.GetOptions{})
		if err != nil {
			return out, fmt.Errorf("joiner %s: read its label: %w", id.Node, err)
		}
		j.Label = n.Labels[v1alpha1.NodeKey(instance)]
		h.progress("%s: lone joiner %s (first list failed: %t) held a slot %s after its start, %d API requests; label %q",
			cfg.Name(), id.Node, failList, ms(j.Wait), j.Requests, j.Label)
		out = append(out, j)
	}
	return out, nil
}

// slotsFree waits until no slot Lease names a holder: the herd is done.
func (h *harness) slotsFree(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		list, err := h.cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: slotSelector})
		held := 0
		if err == nil {
			for _, l := range list.Items {
				if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
					held++
				}
			}
			if held == 0 {
				return nil
			}
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return fmt.Errorf("the herd is done but %d slots are still held (last error %v): %w", held, err, ctx.Err())
		}
	}
}

// runAlone runs one agents process of spec to its end and returns its
// events.
func (h *harness) runAlone(ctx context.Context, spec agentsSpec, logPath string) ([]event, error) {
	ap, err := h.startProc(ctx, spec, logPath)
	if ap != nil {
		defer func() {
			_ = ap.cmd.Process.Kill()
			<-ap.done
		}()
	}
	if err != nil {
		return nil, err
	}
	select {
	case <-ap.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("agent not ready: %w", ctx.Err())
	}
	if _, err := io.WriteString(ap.stdin, "go\n"); err != nil {
		return nil, fmt.Errorf("start the agent: %w (see %s)", err, logPath)
	}
	select {
	case <-ap.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("agent did not end: %w (see %s)", ctx.Err(), logPath)
	}
	if ap.err != nil {
		return nil, fmt.Errorf("agents process: %w (see %s)", ap.err, logPath)
	}
	return ap.events, nil
}

// joiner reads a lone joiner's events: from its agent's start to its Hold
// returning, and the requests it had made then (the hold event's value).
// A joiner whose list was to fail must have seen exactly one failed list.
func joiner(events []event, failList bool) (Joiner, error) {
	j := Joiner{FailedFirstList: failList}
	var start, held int64
	failed := 0
	for _, ev := range events {
		switch ev.Kind {
		case evStart:
			start = ev.T
		case evHold:
			if held != 0 {
				continue
			}
			held = ev.T
			n, err := strconv.Atoi(ev.Value)
			if err != nil {
				return j, fmt.Errorf("hold event without its request count: %q", ev.Value)
			}
			j.Requests = n
		case evListFailed:
			failed++
		case evFailed:
			return j, fmt.Errorf("its agent failed: %s", ev.Value)
		}
	}
	switch {
	case start == 0:
		return j, errors.New("its agent never started")
	case held == 0:
		return j, errors.New("it never held a slot")
	case failList && failed != 1:
		return j, fmt.Errorf("%d lists answered 503, want 1", failed)
	case !failList && failed != 0:
		return j, fmt.Errorf("%d lists answered 503, want none", failed)
	}
	j.Wait = time.Duration(held - start)
	return j, nil
}
