package hits

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/hits/recorded"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

func readRecording(t *testing.T) recorded.Recording {
	t.Helper()
	r, err := recorded.Read()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func pullLines(i Instance) []string {
	var out []string
	for _, n := range i.Nodes {
		for _, p := range n.Pulls {
			out = append(out, fmt.Sprintf("%s %s %s hit=%v %s", n.Node, p.Pod, p.Image, p.Hit, p.Label))
		}
	}
	return out
}

// On the recorded Events: the pod that named the prefetched image by its
// short name is a hit, the pod whose image was added to the list after
// the node was labeled a miss, both while the node was labeled succeeded;
// the pod of an image of no list and the agent's own pod are not in it.
func TestRecorded(t *testing.T) {
	r := readRecording(t)
	got := Build(Source{
		Instance: r.Instance, Namespace: r.Namespace, DaemonSet: r.DaemonSet, List: imagelist.Parse(r.List),
		Key: v1alpha1.NodeKey(r.Instance), Nodes: []corev1.Node{{ObjectMeta: r.Node}}, Kubelet: r.Kubelet, Agent: r.Agent,
	})
	want := []string{
		"node-1 apps/hit present:v1 hit=true succeeded",
		"node-1 apps/miss ghcr.io/e2e/added:v1 hit=false succeeded",
	}
	if strings.Join(pullLines(got), "\n") != strings.Join(want, "\n") || got.Counts != (Counts{Hits: 1, Misses: 1}) || got.Images != 2 {
		t.Errorf("got %+v\n%s\nwant\n%s", got.Counts, strings.Join(pullLines(got), "\n"), strings.Join(want, "\n"))
	}
	// Without the agent's Events and the node's summary, nothing tells
	// what the label said when the pods started.
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: r.Node.Name, Labels: r.Node.Labels}}
	got = Build(Source{Instance: r.Instance, Namespace: r.Namespace, DaemonSet: r.DaemonSet, List: imagelist.Parse(r.List),
		Key: v1alpha1.NodeKey(r.Instance), Nodes: []corev1.Node{node}, Kubelet: r.Kubelet})
	if got.Counts != (Counts{NotCounted: 2}) {
		t.Errorf("without records: %+v", got.Counts)
	}
}

// The kubelet's messages as recorded, and its other wordings.
func TestKubeletPull(t *testing.T) {
	r := readRecording(t)
	words := map[string]string{}
	for _, ev := range r.Kubelet {
		words[ev.InvolvedObject.Name+" "+ev.Reason] = ev.Message
	}
	tests := []struct {
		name, reason, message string
		image                 string // empty: not a kubelet pull
		hit                   bool
	}{
		{name: "recorded hit", reason: "Pulled", message: words["hit Pulled"], image: "present:v1", hit: true},
		{name: "recorded miss", reason: "Pulled", message: words["miss Pulled"], image: "ghcr.io/e2e/added:v1"},
		// v1.36.3's image_manager.go, KubeletEnsureSecretPulledImages off
		// (the default before 1.35).
		{name: "hit without secret-pulled-image checks", reason: "Pulled", message: `Container image "app:1" already present on machine`, image: "app:1", hit: true},
		{name: "folded by the recorder", reason: "Pulled", message: combinedPrefix + words["miss Pulled"], image: "ghcr.io/e2e/added:v1"},
		{name: "quotes in the image", reason: "Pulled", message: `Container image "a\"b" already present on machine`, image: `a"b`, hit: true},
		{name: "recorded pulling", reason: "Pulling", message: words["miss Pulling"], image: "ghcr.io/e2e/added:v1"},
		{name: "pulling, folded", reason: "Pulling", message: combinedPrefix + `Pulling image "app:1"`, image: "app:1"},
		{name: "pulling, no quote", reason: "Pulling", message: `Pulling image app:1`},
		{name: "pulling, other reason", reason: "Pulled", message: `Pulling image "app:1"`},
		{name: "failed", reason: "Failed", message: `Failed to pull image "app:1": not found`},
		{name: "other reason, same words", reason: "Created", message: words["hit Pulled"]},
		{name: "no quote", reason: "Pulled", message: `Container image app:1 already present on machine`},
		{name: "unterminated quote", reason: "Pulled", message: `Successfully pulled image "app:1`},
		{name: "present without the rest", reason: "Pulled", message: `Container image "app:1" is gone`},
		{name: "empty image", reason: "Pulled", message: `Successfully pulled image "" in 1s`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &corev1.Event{Reason: tt.reason, Message: tt.message}
			if tt.reason == "Pulling" {
				image, ok := kubeletPulling(ev)
				if image != tt.image || ok != (tt.image != "") {
					t.Errorf("%q: got %q ok=%v, want %q", tt.message, image, ok, tt.image)
				}
				return
			}
			image, hit, ok := kubeletPull(ev)
			if image != tt.image || hit != tt.hit || ok != (tt.image != "") {
				t.Errorf("%q: got %q hit=%v ok=%v, want %q hit=%v", tt.message, image, hit, ok, tt.image, tt.hit)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	tests := []struct {
		list, image string
		want        bool
	}{
		{"docker.io/library/debian:12", "debian:12", true},
		{"debian", "docker.io/library/debian:latest", true},
		{"index.docker.io/library/debian:12", "debian:12", true},
		{"team/app:1", "docker.io/team/app:1", true},
		{"debian:12", "debian:11", false},
		{"debian:12", "ghcr.io/debian:12", false},
		{"ghcr.io/a/app:1", "ghcr.io/a/app:1", true},
		{"localhost:5000/app:1", "localhost:5000/app:1", true},
		{"localhost:5000/app:1", "localhost:5000/app:2", false},
		{"localhost:5000/app", "localhost:5000/app:latest", true},
		{"app@" + d1, "app@" + d1, true},
		{"app@" + d1, "app@" + d2, false},
		{"app:1@" + d1, "app@" + d1, true},
		{"app:1@" + d1, "app:1@" + d2, false},
		// The tag when only one side has a digest; a digest alone says
		// nothing about a tag.
		{"app:1@" + d1, "app:1", true},
		{"app:1", "app:1@" + d1, true},
		{"app:1", "app@" + d1, false},
		{"app@" + d1, "app:1", false},
		{"app:1", "App:1", false},
	}
	for _, tt := range tests {
		m := newMatcher(imagelist.Parse(tt.list))
		if got := m.matches(tt.image); got != tt.want {
			t.Errorf("list %q, image %q: %v, want %v", tt.list, tt.image, got, tt.want)
		}
	}
}

func TestAgentPods(t *testing.T) {
	long := strings.Repeat("x", 60)
	tests := []struct {
		ds, pod string
		want    bool
	}{
		{"image-prefetcher-web", "image-prefetcher-web-7kq2x", true},
		{"image-prefetcher-web", "image-prefetcher-web-2-7kq2x", false},
		{"image-prefetcher-web-2", "image-prefetcher-web-7kq2x", false},
		{"image-prefetcher-web", "image-prefetcher-web-7kq2", false},
		{long, long[:57] + "-abcde", false},
		{long, long[:58] + "abcde", true},
		{"", "-abcde", false},
	}
	for _, tt := range tests {
		if got := agentPods(tt.ds)(tt.pod); got != tt.want {
			t.Errorf("%s / %s: %v, want %v", tt.ds, tt.pod, got, tt.want)
		}
	}
}

// at is a time of the test's day, by minute and second.
func at(ms string) time.Time {
	t, err := time.Parse(time.RFC3339, "2026-01-01T10:"+ms+"Z")
	if err != nil {
		panic(err)
	}
	return t
}

const ds = "image-prefetcher-web"

func agentEv(reason, node, stamp string) corev1.Event {
	return agentEvOf(ds+"-abcde", reason, node, stamp)
}

func agentEvOf(pod, reason, node, stamp string) corev1.Event {
	return corev1.Event{
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "prefetch", Name: pod},
		Reason:         reason, Source: corev1.EventSource{Component: events.Component, Host: node},
		FirstTimestamp: metav1.NewTime(at(stamp)), LastTimestamp: metav1.NewTime(at(stamp)), Count: 1,
	}
}

func pullEv(ns, pod, container, node, stamp, message string) corev1.Event {
	return corev1.Event{
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod, UID: types.UID(pod + "-uid"), FieldPath: container},
		Reason:         "Pulled", Message: message, Source: corev1.EventSource{Component: "kubelet", Host: node},
		FirstTimestamp: metav1.NewTime(at(stamp)), LastTimestamp: metav1.NewTime(at(stamp)), Count: 1,
	}
}

func hitEv(pod, node, stamp string) corev1.Event {
	return pullEv("apps", pod, "spec.containers{app}", node, stamp, `Container image "app:1" already present on machine and can be accessed by the pod`)
}

func missEv(pod, node, stamp string) corev1.Event {
	return pullEv("apps", pod, "spec.containers{app}", node, stamp, `Successfully pulled image "app:1" in 1.2s (1.2s including waiting). Image size: 100 bytes.`)
}

func pullingEv(pod, container, node, stamp string) corev1.Event {
	ev := pullEv("apps", pod, container, node, stamp, `Pulling image "app:1"`)
	ev.Reason = "Pulling"
	return ev
}

func fetchStart(pod, node, stamp string) corev1.Event {
	return pullEv("prefetch", pod, "spec.initContainers{fetch}", node, stamp, `Container image "ghcr.io/image-prefetcher/image-prefetcher:0.1.0" already present on machine`)
}

func nodeWith(name, value, completedAt string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.NodeKey("web"): value}}}
	if completedAt != "" {
		s := label.NewSummary(1, 1, nil, time.Second, at(completedAt))
		n.Annotations = map[string]string{v1alpha1.NodeKey("web"): s.Marshal()}
	}
	return n
}

// What the label said when each pod started, from the agent's Events, the
// starts of its fetch and the node's summary.
func TestLabelAtTheTime(t *testing.T) {
	tests := []struct {
		name    string
		nodes   []corev1.Node
		kubelet []corev1.Event
		agent   []corev1.Event
		want    []string
	}{
		{
			name:    "succeeded since the summary",
			nodes:   []corev1.Node{nodeWith("n1", "succeeded", "05:00")},
			kubelet: []corev1.Event{hitEv("before", "n1", "04:59"), hitEv("same-second", "n1", "05:00"), missEv("after", "n1", "30:00")},
			want:    []string{"n1 apps/before hit=true unknown", "n1 apps/same-second hit=true succeeded", "n1 apps/after hit=false succeeded"},
		},
		{
			name:  "removed, then pulled again",
			nodes: []corev1.Node{nodeWith("n1", "succeeded", "20:00")},
			agent: []corev1.Event{agentEv(events.ReasonPrefetched, "n1", "01:00"), agentEv(events.ReasonPrefetchFailed, "n1", "10:00"), agentEv(events.ReasonPrefetched, "n1", "20:00")},
			kubelet: []corev1.Event{
				missEv("lied", "n1", "09:59"), missEv("told", "n1", "10:01"), missEv("still-failed", "n1", "19:59"), hitEv("again", "n1", "20:00"),
			},
			want: []string{"n1 apps/lied hit=false succeeded", "n1 apps/told hit=false failed", "n1 apps/still-failed hit=false failed", "n1 apps/again hit=true succeeded"},
		},
		{
			name:  "a fetch writes its first label without an Event",
			nodes: []corev1.Node{nodeWith("n1", "succeeded", "30:00")},
			agent: []corev1.Event{agentEv(events.ReasonPrefetched, "n1", "01:00"), agentEvOf(ds+"-fghij", events.ReasonPrefetched, "n1", "30:00")},
			kubelet: []corev1.Event{
				fetchStart(ds+"-fghij", "n1", "20:00"), missEv("before", "n1", "19:59"), missEv("during", "n1", "20:00"), hitEv("after", "n1", "30:00"),
			},
			want: []string{"n1 apps/before hit=false succeeded", "n1 apps/during hit=false unknown", "n1 apps/after hit=true succeeded"},
		},
		{
			name:  "not the instance's records",
			nodes: []corev1.Node{nodeWith("n1", "failed", "30:00"), nodeWith("n2", "succeeded", "")},
			agent: []corev1.Event{
				agentEvOf("image-prefetcher-web-2-abcde", events.ReasonPrefetched, "n1", "01:00"), // another instance
				agentEv(events.ReasonPrefetched, "n2", "01:00"),                                   // another node
				agentEv(events.ReasonInstanceConflict, "n1", "01:00"),
			},
			kubelet: []corev1.Event{missEv("p", "n1", "10:00"), missEv("q", "n2", "10:00"), hitEv("r", "n1", "31:00")},
			want:    []string{"n1 apps/p hit=false unknown", "n1 apps/r hit=true failed", "n2 apps/q hit=false succeeded"},
		},
		{
			name:  "nodes without the label, images of no list, the agent's own pods",
			nodes: []corev1.Node{nodeWith("n1", "succeeded", "00:00"), {ObjectMeta: metav1.ObjectMeta{Name: "n2"}}},
			kubelet: []corev1.Event{
				hitEv("p", "n2", "10:00"), hitEv("p", "n3", "10:00"),
				pullEv("apps", "q", "spec.containers{x}", "n1", "10:00", `Container image "other:1" already present on machine`),
				pullEv("prefetch", ds+"-abcde", "spec.containers{watch}", "n1", "10:00", `Container image "app:1" already present on machine`),
			},
			want: nil,
		},
		{
			// The pull started while the label said failed, and ended after
			// the agent's repair.
			name:  "a miss counts from the start of its pull",
			nodes: []corev1.Node{nodeWith("n1", "succeeded", "20:00")},
			agent: []corev1.Event{agentEv(events.ReasonPrefetched, "n1", "01:00"), agentEv(events.ReasonPrefetchFailed, "n1", "10:00"), agentEv(events.ReasonPrefetched, "n1", "20:00")},
			kubelet: []corev1.Event{
				pullingEv("p", "spec.containers{app}", "n1", "15:00"), missEv("p", "n1", "20:01"),
				pullingEv("q", "spec.initContainers{init}", "n1", "05:00"), hitEv("q", "n1", "25:01"), // another container's
			},
			want: []string{"n1 apps/p hit=false failed", "n1 apps/q hit=true succeeded"},
		},
		{
			name:  "a miss in the second the label changed is not ordered, a hit counts after",
			nodes: []corev1.Node{nodeWith("n1", "succeeded", "20:00")},
			agent: []corev1.Event{agentEv(events.ReasonPrefetched, "n1", "01:00"), agentEv(events.ReasonPrefetchFailed, "n1", "10:00"), agentEv(events.ReasonPrefetched, "n1", "20:00")},
			kubelet: []corev1.Event{
				pullingEv("removed", "spec.containers{app}", "n1", "10:00"), missEv("removed", "n1", "10:01"),
				pullingEv("repaired", "spec.containers{app}", "n1", "20:00"), missEv("repaired", "n1", "20:00"),
				hitEv("present", "n1", "20:00"),
			},
			want: []string{"n1 apps/removed hit=false unknown", "n1 apps/present hit=true succeeded", "n1 apps/repaired hit=false unknown"},
		},
		{
			name:    "a record of the same label in a miss's second changes nothing",
			nodes:   []corev1.Node{nodeWith("n1", "succeeded", "05:00")},
			agent:   []corev1.Event{agentEv(events.ReasonPrefetched, "n1", "01:00")},
			kubelet: []corev1.Event{pullingEv("p", "spec.containers{app}", "n1", "05:00"), missEv("p", "n1", "05:02")},
			want:    []string{"n1 apps/p hit=false succeeded"},
		},
		{
			name:  "a container counts once, by its first start",
			nodes: []corev1.Node{nodeWith("n1", "succeeded", "00:00")},
			kubelet: []corev1.Event{
				missEv("p", "n1", "10:00"), hitEv("p", "n1", "12:00"),
				pullEv("apps", "p", "spec.initContainers{init}", "n1", "09:00", `Container image "app:1" already present on machine`),
			},
			// The init container at 09:00, then the app container's first
			// start at 10:00; its restart at 12:00 is left out.
			want: []string{"n1 apps/p hit=true succeeded", "n1 apps/p hit=false succeeded"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Build(Source{Instance: "web", Namespace: "prefetch", DaemonSet: ds, List: imagelist.Parse("app:1"),
				Key: v1alpha1.NodeKey("web"), Nodes: tt.nodes, Kubelet: tt.kubelet, Agent: tt.agent})
			lines := pullLines(got)
			for i := range lines {
				lines[i] = strings.Replace(lines[i], " app:1 ", " ", 1)
			}
			if strings.Join(lines, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tt.want, "\n"))
			}
			var sum Counts
			for _, n := range got.Nodes {
				for _, p := range n.Pulls {
					sum.add(p)
				}
			}
			if sum != got.Counts {
				t.Errorf("totals %+v, want the sum of the pulls %+v", got.Counts, sum)
			}
		})
	}
}
