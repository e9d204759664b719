package cluster

import (
	"bufio"
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// Log follows one container's log, from the container's start.
type Log struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed, and replaced, at each line
	done    chan struct{}
}

// FollowLog follows the log of a container of pod until ctx ends.
func (c *Cluster) FollowLog(ctx context.Context, namespace, pod, container string) (*Log, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	stream, err := cs.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true}).Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("follow the log of %s/%s, %s: %w", namespace, pod, container, err)
	}
	l := &Log{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer stream.Close()
		sc := bufio.NewScanner(stream)
		sc.Buffer(nil, 1<<20) // a summary of many images is one line
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			close(l.changed)
			l.changed = make(chan struct{})
			l.mu.Unlock()
		}
	}()
	return l, nil
}

// Wait waits until a line matches want.
func (l *Log) Wait(ctx context.Context, want *regexp.Regexp) error {
	for seen := 0; ; {
		ended := false
		select {
		case <-l.done:
			ended = true
		default:
		}
		l.mu.Lock()
		lines, changed := l.lines[seen:], l.changed
		seen = len(l.lines)
		l.mu.Unlock()
		for _, line := range lines {
			if want.MatchString(line) {
				return nil
			}
		}
		if ended {
			return fmt.Errorf("the log ended without a line matching %s:\n%s", want, l)
		}
		select {
		case <-changed:
		case <-l.done:
		case <-ctx.Done():
			return fmt.Errorf("no line matching %s: %w\n%s", want, ctx.Err(), l)
		}
	}
}

// watching is what the agent's watch says once its SIGTERM handler is in
// place (or, with nothing to watch, that it waits for SIGTERM).
var watching = regexp.MustCompile(`msg=watching|waiting for SIGTERM`)

// Watching waits until the agent's watch container (a Log of it) can
// settle its key and pins on SIGTERM. A running container is not yet
// that: a SIGTERM that comes before its handler is in place (the
// process's first moments, long under load) ends it at once, and what it
// wrote stays (docs/agent.md).
func (l *Log) Watching(ctx context.Context) error { return l.Wait(ctx, watching) }

// Ended waits until the log has ended (the container stopped, or ctx
// ended).
func (l *Log) Ended() { <-l.done }

// String is the log so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
