package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// WatchLog follows the log of an agent pod's watch container.
type WatchLog struct {
	mu       sync.Mutex
	text     bytes.Buffer
	watching chan struct{}
	done     chan struct{}
}

// FollowWatch follows the log of pod's watch container until ctx ends.
// A running container is not yet an agent that settles its key and pins
// on SIGTERM: a SIGTERM that comes before its handler is in place (the
// process's first moments, long under load) ends it at once, and what it
// wrote stays (docs/agent.md). It has said "watching" once the handler is
// there: Watching waits for that.
func (c *Cluster) FollowWatch(ctx context.Context, namespace, pod string) (*WatchLog, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	stream, err := cs.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: "watch", Follow: true}).Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("follow the watch log of %s/%s: %w", namespace, pod, err)
	}
	w := &WatchLog{watching: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer stream.Close()
		var once sync.Once
		sc := bufio.NewScanner(stream)
		sc.Buffer(nil, 1<<20) // a summary of many images is one line
		for sc.Scan() {
			w.mu.Lock()
			w.text.Write(append(sc.Bytes(), '\n'))
			w.mu.Unlock()
			if line := sc.Text(); strings.Contains(line, "msg=watching") || strings.Contains(line, "waiting for SIGTERM") {
				once.Do(func() { close(w.watching) })
			}
		}
	}()
	return w, nil
}

// Watching waits until watch has said that it is watching.
func (w *WatchLog) Watching(ctx context.Context) error {
	select {
	case <-w.watching:
		return nil
	case <-w.done:
		return fmt.Errorf("the watch log ended before it said it was watching:\n%s", w.String())
	case <-ctx.Done():
		return fmt.Errorf("watch did not say it was watching: %w\n%s", ctx.Err(), w.String())
	}
}

// Ended waits until the log has ended (the container stopped, or ctx
// ended).
func (w *WatchLog) Ended() { <-w.done }

// String is the log so far.
func (w *WatchLog) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.text.String()
}
