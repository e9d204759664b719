package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/image-prefetcher/image-prefetcher/agent/hits"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// hitsEnv: instance web of namespace prefetch on n1 (succeeded since
// 10:00) and n2 (failed); its list holds app:1. The kubelet reports a hit
// on n1, a miss on n1, and a miss on n2.
func hitsEnv(t *testing.T, owned bool) *env {
	e := newEnv(t)
	const key = "image-prefetcher.stackrox.io/web"
	ann := func(value string) string {
		s := label.NewSummary(1, 1, nil, time.Second, time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC))
		if owned {
			o := label.NewOwner("prefetch", "web")
			s.Owner = &o
		}
		return s.Marshal()
	}
	node := func(name, value string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{key: value}, Annotations: map[string]string{key: ann(value)}}}
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-web", Namespace: "prefetch", Labels: map[string]string{"app.kubernetes.io/name": "image-prefetcher", "app.kubernetes.io/instance": "web"}},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "image-list", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "image-prefetcher-web.images-5t7g"}}}},
		}}}},
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-web.images-5t7g", Namespace: "prefetch"}, Data: map[string]string{"images.txt": "docker.io/library/app:1\n"}}
	ev := func(name, node string, minute int, message string) *corev1.Event {
		ts := metav1.NewTime(time.Date(2026, 1, 1, 10, minute, 0, 0, time.UTC))
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name + ".1", Namespace: "apps"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "apps", Name: name, FieldPath: "spec.containers{app}"},
			Reason:         "Pulled", Message: message, Source: corev1.EventSource{Component: "kubelet", Host: node},
			FirstTimestamp: ts, LastTimestamp: ts, Count: 1,
		}
	}
	e.kube = fake.NewClientset(node("n1", "succeeded"), node("n2", "failed"), ds, cm,
		ev("a", "n1", 1, `Container image "app:1" already present on machine and can be accessed by the pod`),
		ev("b", "n1", 2, `Successfully pulled image "app:1" in 1s (1s including waiting). Image size: 1 bytes.`),
		ev("c", "n2", 3, `Successfully pulled image "app:1" in 1s (1s including waiting). Image size: 1 bytes.`),
	)
	return e
}

func TestStatusHits(t *testing.T) {
	e := hitsEnv(t, true)
	if code := e.run("status", "--hits"); code != ExitError {
		t.Errorf("exit %d, want 1: n2 is failed", code)
	}
	want := `INSTANCE  NODE   LABEL      HITS  MISSES  NOT-COUNTED
web       (all)  -          1     1       1
web       n1     succeeded  1     1       0
web       n2     failed     0     0       1
miss: web on n1 at 2026-01-01T10:02:00Z (label succeeded): pod apps/b pulled app:1
miss: web on n2 at 2026-01-01T10:03:00Z (label failed, not counted): pod apps/c pulled app:1
Counted: containers started while the node was labeled succeeded; a hit found the image on the node, a miss pulled it (the kubelet's Events, since 2026-01-01T10:01:00Z; the apiserver keeps Events for its --event-ttl, 1h by default).
Note: ` + hits.VerificationNote + `
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}

	e.stdout = &syncBuffer{}
	if code := e.run("status", "--hits", "-o", "json", "-l", "image-prefetcher.stackrox.io/web=succeeded"); code != 0 {
		t.Errorf("exit %d, want 0: n1 is succeeded\n%s", code, e.logs)
	}
	var r hits.Report
	if err := json.Unmarshal([]byte(e.stdout.String()), &r); err != nil {
		t.Fatalf("%v\n%s", err, e.stdout)
	}
	if len(r.Instances) != 1 || r.Instances[0].Namespace != "prefetch" || r.Instances[0].Images != 1 || len(r.Instances[0].Nodes) != 1 ||
		r.Instances[0].Counts != (hits.Counts{Hits: 1, Misses: 1}) || len(r.Instances[0].Nodes[0].Pulls) != 2 {
		t.Errorf("%s", e.stdout)
	}
}

// Without an owner in the annotations, the namespace comes from
// --namespace; without either, the instance has no view, and says why.
func TestStatusHitsNamespace(t *testing.T) {
	e := hitsEnv(t, false)
	if code := e.run("status", "--hits", "-l", "image-prefetcher.stackrox.io/web=succeeded"); code != ExitError ||
		!strings.Contains(e.stdout.String(), "web: no view: its namespace is not known (no node's annotation names the owner): pass --namespace") {
		t.Errorf("exit %d:\n%s", code, e.stdout)
	}
	e.stdout = &syncBuffer{}
	if code := e.run("status", "--hits", "-l", "image-prefetcher.stackrox.io/web=succeeded", "--namespace", "prefetch"); code != 0 ||
		!strings.Contains(e.stdout.String(), "web       n1     succeeded  1     1       0") {
		t.Errorf("exit %d:\n%s", code, e.stdout)
	}
	e.stdout = &syncBuffer{}
	if code := e.run("status", "--hits", "--namespace", "elsewhere", "-l", "image-prefetcher.stackrox.io/web=succeeded"); code != ExitError ||
		!strings.Contains(e.stdout.String(), `web: no view: 0 DaemonSets in elsewhere are labeled app.kubernetes.io/name=image-prefetcher,app.kubernetes.io/instance=web (), want 1`) {
		t.Errorf("exit %d:\n%s", code, e.stdout)
	}
}

// A user who may not list Events gets an error that says what --hits
// needs, and nothing on stdout.
func TestStatusHitsForbidden(t *testing.T) {
	e := hitsEnv(t, true)
	e.kube.PrependReactor("list", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", nil)
	})
	if code := e.run("status", "--hits"); code != ExitError || e.stdout.String() != "" ||
		!strings.Contains(e.logs.String(), "list the kubelet's Pulled Events of every namespace (status --hits needs list on events cluster-wide)") {
		t.Errorf("exit %d\nstdout: %s\nlogs: %s", code, e.stdout, e.logs)
	}
}
