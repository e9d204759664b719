package disk_test

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// removalBound is how soon a removed image must turn the label failed
// (issue #25).
const removalBound = 15 * time.Second

// TestRemovalRepairedUnderHerdControl removes a prefetched image from the
// node's containerd (`ctr images rm`, as image GC or a person would) while
// the instance's only pull slot (maxConcurrentNodes: 1) is held by another
// node. The label turns failed, Removed, within 15 s; the repair waits for
// the slot, and the image stays away meanwhile; once the slot is free the
// agent takes it, pulls the image again and the label is succeeded.
func TestRemovalRepairedUnderHerdControl(t *testing.T) {
	const instance = "gc"
	refs := c.PushData(t, 600, 64<<10, "kept")
	c.Deploy(t, instance, "  pull:\n    maxConcurrentNodes: 1\n  images:\n  - "+refs[0]+"\n")
	waitNode(t, "labeled succeeded", 3*time.Minute, labeled(instance, "succeeded", ""))
	logs := follow(t, instance, "watch")
	logs.wait(t, "msg=watching")

	// Another node takes the only slot, which the first pull left free.
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leases := cs.CoordinationV1().Leases(instance)
	slot, err := leases.Get(ctx, v1alpha1.LeaseName(instance, 0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, now, secs := "another-node", metav1.NewMicroTime(time.Now()), int32(120)
	slot.Spec.HolderIdentity, slot.Spec.AcquireTime, slot.Spec.RenewTime, slot.Spec.LeaseDurationSeconds = &other, &now, &now, &secs
	if slot, err = leases.Update(ctx, slot, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	n := c.Nodes()[0]
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.CRISocket, "-n", "k8s.io", "images", "rm", refs[0]).CombinedOutput(); err != nil {
		t.Fatalf("ctr images rm: %v\n%s", err, out)
	}
	removed := time.Now()
	waitNode(t, "labeled Removed", time.Minute, labeled(instance, "failed", "Removed"))
	if d := time.Since(removed); d > removalBound {
		t.Errorf("labeled Removed %s after the removal, want within %s", d.Round(100*time.Millisecond), removalBound)
	} else {
		t.Logf("labeled Removed %s after the removal", d.Round(100*time.Millisecond))
	}

	logs.wait(t, "all pull slots are busy; waiting")
	if ok, err := n.HasImage(ctx, refs[0]); ok || err != nil {
		t.Errorf("the image was pulled again while the only slot was another node's (%v)", err)
	}
	slot.Spec.HolderIdentity, slot.Spec.AcquireTime = nil, nil
	if _, err := leases.Update(ctx, slot, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNode(t, "labeled succeeded again", time.Minute, labeled(instance, "succeeded", ""))
	if ok, err := n.HasImage(ctx, refs[0]); !ok || err != nil {
		t.Errorf("the label is succeeded again, but the image is not there (%v)", err)
	}
	logs.wait(t, "acquired pull slot")
}

// podLog follows one container's log from now on.
type podLog struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

// follow streams the log of container in instance's pod, from its start
// until the test ends, once the container runs.
func follow(t *testing.T, instance, container string) *podLog {
	t.Helper()
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	var pod string
	if err := cluster.Poll(wctx, 250*time.Millisecond, container+" running in "+instance, func() (bool, string) {
		pods, err := cs.CoreV1().Pods(instance).List(wctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			for _, st := range p.Status.ContainerStatuses {
				if st.Name == container && st.State.Running != nil {
					pod = p.Name
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	}); err != nil {
		cancel()
		t.Fatal(err)
	}
	stream, err := cs.CoreV1().Pods(instance).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := &podLog{changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stream)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			l.mu.Unlock()
			select {
			case l.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		stream.Close()
		<-done
		if t.Failed() {
			t.Logf("log of %s, %s:\n%s", instance, container, strings.Join(l.lines, "\n"))
		}
	})
	return l
}

// wait waits for a line containing s.
func (l *podLog) wait(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		l.mu.Lock()
		for _, line := range l.lines {
			if strings.Contains(line, s) {
				l.mu.Unlock()
				return
			}
		}
		l.mu.Unlock()
		select {
		case <-l.changed:
		case <-timeout:
			t.Fatalf("no log line with %q within a minute", s)
		}
	}
}
