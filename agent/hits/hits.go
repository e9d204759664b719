// Package hits tells, from the kubelet's own Events, whether the pods that
// ran an instance's images found them on the node (a hit) or had to pull
// them (a miss), and what the instance's node label said at the time.
// `image-prefetcher status --hits` shows it: the user's proof that the
// prefetched images stayed.
//
// Only Events are read, with the user's credentials: the kubelet's Pulled
// Events of every namespace, the agent's own Prefetched/PrefetchFailed
// Events, and the instance's DaemonSet and list ConfigMap. Events last as
// long as the apiserver's --event-ttl (1 hour by default), so the view
// covers about the last hour.
package hits

import (
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/events"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// LabelUnknown is the label state of a time no record covers.
const LabelUnknown = "unknown"

// Pull is a container's first start the kubelet reported on.
type Pull struct {
	// Pod is namespace/name.
	Pod string `json:"pod"`
	// Container is the Event's field path, such as spec.containers{app}.
	Container string `json:"container"`
	Image     string `json:"image"`
	// Time is when the kubelet found the image there (a hit) or started
	// to pull it (a miss).
	Time time.Time `json:"time"`
	// Hit: the kubelet found the image on the node; otherwise it pulled it.
	Hit bool `json:"hit"`
	// Label is the instance's label on the node at that time: succeeded,
	// failed, or unknown when no record covers it.
	Label string `json:"label"`
}

// Counted reports whether p counts as a hit or miss: it happened while
// the node was labeled succeeded.
func (p Pull) Counted() bool { return p.Label == v1alpha1.LabelSucceeded }

// Counts are hits and misses while the node was labeled succeeded, and the
// pulls of other times.
type Counts struct {
	Hits       int `json:"hits"`
	Misses     int `json:"misses"`
	NotCounted int `json:"notCounted"`
}

func (c *Counts) add(p Pull) {
	switch {
	case !p.Counted():
		c.NotCounted++
	case p.Hit:
		c.Hits++
	default:
		c.Misses++
	}
}

// Node is one node's view of an instance.
type Node struct {
	Node string `json:"node"`
	// Label is the instance's label on the node now.
	Label string `json:"label"`
	Counts
	Pulls []Pull `json:"pulls"`
}

// Instance is one instance's view.
type Instance struct {
	Instance  string `json:"instance"`
	Namespace string `json:"namespace,omitempty"`
	// Images is the length of the instance's list.
	Images int `json:"images"`
	Counts
	Nodes []Node `json:"nodes"`
	// Error says why the view of this instance could not be built.
	Error string `json:"error,omitempty"`
}

// Report is the whole view, and `status --hits -o json`.
type Report struct {
	// Since is the time of the oldest kubelet Event the apiserver still
	// kept: nothing before it can be seen.
	Since     *time.Time `json:"since,omitempty"`
	Instances []Instance `json:"instances"`
	// Note, set when there are misses, says what a miss may also be.
	Note string `json:"note,omitempty"`
}

// VerificationNote is Report.Note. Under the kubelet's
// imagePullCredentialsVerificationPolicy AlwaysVerify or
// NeverVerifyAllowlistedImages, a pod's start that only checked its
// credentials with the registry (a manifest request, no layer) gets the
// same Pulled Event as a download (tests/credentials): the Events cannot
// tell the two apart, so the view does not guess.
const VerificationNote = "A miss may be a credential verification and no download: under the kubelet's imagePullCredentialsVerificationPolicy AlwaysVerify or NeverVerifyAllowlistedImages, a start that only checked the pod's credentials with the registry has the same Pulled Event as a download. The kubelet's metric kubelet_image_manager_ensure_image_requests_total{present_locally=\"true\",pull_required=\"true\"} counts those starts, per node."

// noteMisses sets Note when any instance has a miss, counted or not.
func (r *Report) noteMisses() {
	for _, i := range r.Instances {
		for _, n := range i.Nodes {
			for _, p := range n.Pulls {
				if !p.Hit {
					r.Note = VerificationNote
					return
				}
			}
		}
	}
}

// Source is what one instance's view is built from.
type Source struct {
	Instance, Namespace string
	// DaemonSet is the instance's DaemonSet, whose pods are the agent's.
	DaemonSet string
	List      imagelist.List
	// Key is the instance's node label and annotation key.
	Key   string
	Nodes []corev1.Node
	// Kubelet are the kubelet's Pulled and Pulling Events of every
	// namespace; Agent are the Events of the agent's source in the
	// instance's namespace.
	Kubelet, Agent []corev1.Event
}

// Build builds the view of one instance. Only nodes that carry the
// instance's label now are in it.
func Build(src Source) Instance {
	inst := Instance{Instance: src.Instance, Namespace: src.Namespace, Images: len(src.List.Entries), Nodes: []Node{}}
	m := newMatcher(src.List)
	agentPod := agentPods(src.DaemonSet)
	byNode := map[string]*Node{}
	lines := map[string]*timeline{}
	for _, n := range src.Nodes {
		v, ok := n.Labels[src.Key]
		if !ok {
			continue
		}
		byNode[n.Name] = &Node{Node: n.Name, Label: v, Pulls: []Pull{}}
		tl := &timeline{}
		if s, err := label.Parse(n.Annotations[src.Key]); err == nil {
			if at, err := time.Parse(time.RFC3339, s.CompletedAt); err == nil {
				tl.add(at, v)
			}
		}
		lines[n.Name] = tl
	}
	for i := range src.Agent {
		ev := &src.Agent[i]
		tl := lines[eventNode(ev)]
		if tl == nil || ev.InvolvedObject.Namespace != src.Namespace || !agentPod(ev.InvolvedObject.Name) {
			continue
		}
		switch ev.Reason {
		case events.ReasonPrefetched:
			tl.add(eventTime(ev), v1alpha1.LabelSucceeded)
		case events.ReasonPrefetchFailed:
			tl.add(eventTime(ev), v1alpha1.LabelFailed)
		}
	}
	// The first label a fetch writes, while it pulls, records no Event: from
	// the start of an agent pod's init container until its next Event, the
	// label is not known.
	type container struct{ node, pod, uid, path string }
	first := map[container]Pull{}
	pulling := map[container]time.Time{}
	for i := range src.Kubelet {
		ev := &src.Kubelet[i]
		node := byNode[eventNode(ev)]
		if node == nil {
			continue
		}
		obj := ev.InvolvedObject
		if obj.Namespace == src.Namespace && agentPod(obj.Name) {
			if strings.HasPrefix(obj.FieldPath, "spec.initContainers") {
				tl := lines[node.Node]
				tl.add(eventTime(ev), LabelUnknown)
				if ev.Count > 1 {
					tl.add(ev.LastTimestamp.Time, LabelUnknown)
				}
			}
			continue
		}
		key := container{node.Node, obj.Namespace + "/" + obj.Name, string(obj.UID), obj.FieldPath}
		if image, ok := kubeletPulling(ev); ok && m.matches(image) {
			if t, seen := pulling[key]; !seen || eventTime(ev).Before(t) {
				pulling[key] = eventTime(ev)
			}
			continue
		}
		image, hit, ok := kubeletPull(ev)
		if !ok || !m.matches(image) {
			continue
		}
		p := Pull{Pod: key.pod, Container: key.path, Image: image, Time: eventTime(ev), Hit: hit}
		// A restarted container's later Events do not count again: its
		// first start tells whether the image was there for it.
		if prev, seen := first[key]; !seen || p.Time.Before(prev.Time) {
			first[key] = p
		}
	}
	for _, tl := range lines {
		tl.sort()
	}
	for key, p := range first {
		// A pull can take minutes, and the label change meanwhile: what
		// counts is what it said when the kubelet found the image missing.
		if t, seen := pulling[key]; seen && !p.Hit && t.Before(p.Time) {
			p.Time = t
		}
		node := byNode[key.node]
		p.Label = lines[key.node].at(p.Time, !p.Hit)
		node.Pulls = append(node.Pulls, p)
		node.add(p)
	}
	for _, n := range byNode {
		sort.Slice(n.Pulls, func(i, j int) bool {
			a, b := n.Pulls[i], n.Pulls[j]
			if !a.Time.Equal(b.Time) {
				return a.Time.Before(b.Time)
			}
			if a.Pod != b.Pod {
				return a.Pod < b.Pod
			}
			return a.Container < b.Container
		})
		inst.Hits += n.Hits
		inst.Misses += n.Misses
		inst.NotCounted += n.NotCounted
		inst.Nodes = append(inst.Nodes, *n)
	}
	sort.Slice(inst.Nodes, func(i, j int) bool { return inst.Nodes[i].Node < inst.Nodes[j].Node })
	return inst
}

// Oldest is the time of the oldest of the Events, nil when none.
func Oldest(kubelet []corev1.Event) *time.Time {
	var oldest *time.Time
	for i := range kubelet {
		if t := eventTime(&kubelet[i]); oldest == nil || t.Before(*oldest) {
			oldest = &t
		}
	}
	return oldest
}

// agentPods recognises the names of a DaemonSet's pods: the DaemonSet's
// name and "-", cut to 58 characters, then 5 random ones (the apiserver's
// generateName).
func agentPods(daemonSet string) func(pod string) bool {
	base := daemonSet + "-"
	if len(base) > 58 {
		base = base[:58]
	}
	return func(pod string) bool {
		return daemonSet != "" && len(pod) == len(base)+5 && strings.HasPrefix(pod, base)
	}
}

// timeline is what an instance's label on one node said, and since when.
type timeline struct{ points []point }

type point struct {
	at    time.Time
	state string
}

func (t *timeline) add(at time.Time, state string) {
	t.points = append(t.points, point{at, state})
}

// sort orders the records by time. Of records of the same second (Events
// have a resolution of one second), an unknown one comes first: a fetch
// starts before the label it writes.
func (t *timeline) sort() {
	sort.SliceStable(t.points, func(i, j int) bool {
		a, b := t.points[i], t.points[j]
		if !a.at.Equal(b.at) {
			return a.at.Before(b.at)
		}
		return a.state == LabelUnknown && b.state != LabelUnknown
	})
}

// at is the label at time x: that of the last record at or before x.
// Records and Events have a resolution of one second: a miss in the
// second the label changed cannot be ordered with the change, and its
// label is unknown. A hit then counts under the new label, as a pod
// placed by the label starts after it.
func (t *timeline) at(x time.Time, miss bool) string {
	before, state := LabelUnknown, LabelUnknown
	for _, p := range t.points {
		if p.at.After(x) {
			break
		}
		// A record that the label is unknown counts in its second too.
		if p.at.Before(x) || p.state == LabelUnknown {
			before = p.state
		}
		state = p.state
	}
	if miss && before != state {
		return LabelUnknown
	}
	return state
}
