package disk_test

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"testing"
	"time"

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
	waitLine(t, logs, "msg=watching")

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

	waitLine(t, logs, "all pull slots are busy; waiting")
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
	waitLine(t, logs, "acquired pull slot")
}

// follow follows the log of container in instance's pod, from its start
// until the test ends, once the container runs.
func follow(t *testing.T, instance, container string) *cluster.Log {
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
	l, err := c.FollowLog(ctx, instance, pod, container)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		l.Ended()
		if t.Failed() {
			t.Logf("log of %s, %s:\n%s", instance, container, l)
		}
	})
	return l
}

// waitLine waits a minute at most for a line of l containing s.
func waitLine(t *testing.T, l *cluster.Log, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.Wait(ctx, regexp.MustCompile(regexp.QuoteMeta(s))); err != nil {
		t.Fatal(err)
	}
}
