package cli

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// status shows each node's image filesystem against the ceiling, as its
// agent wrote it, in the table and in -o json.
func TestStatusDisk(t *testing.T) {
	e := newEnv(t)
	const key = "image-prefetcher.stackrox.io/web"
	full := `{"total":1,"present":0,"failed":[{"image":"big:1","reason":"InsufficientDisk","message":"..."}],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z","disk":{"usedBytes":83886080,"capacityBytes":100663296,"ceilingPercent":80}}`
	ok := `{"total":1,"present":1,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z","disk":{"usedBytes":4294967296,"capacityBytes":17179869184,"ceilingPercent":80}}`
	unknown := `{"total":1,"present":1,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z","disk":{"usedBytes":0,"capacityBytes":0,"ceilingPercent":80,"unknown":"image filesystem capacity unknown: kubelet stats: 403 Forbidden"}}`
	older := `{"total":1,"present":1,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z"}`
	mk := func(name, value, ann string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{key: value}, Annotations: map[string]string{key: ann}}}
	}
	e.kube = fake.NewClientset(mk("n1", "failed", full), mk("n2", "succeeded", ok), mk("n3", "succeeded", older), mk("n4", "succeeded", unknown))
	if code := e.run("status"); code != ExitError {
		t.Errorf("exit %d, want 1", code)
	}
	want := `NODE  INSTANCE  STATE      OWNER  PRESENT  IMAGE-FS             FAILURES
n1    web       failed     -      0/1      84% (ceiling 80%)    big:1 (InsufficientDisk)
n2    web       succeeded  -      1/1      25% (ceiling 80%)    -
n3    web       succeeded  -      1/1      -                    -
n4    web       succeeded  -      1/1      unknown: no ceiling  -
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}

	e.stdout.b.Reset()
	e.run("status", "-o", "json")
	var rows []NodeStatus
	if err := json.Unmarshal([]byte(e.stdout.String()), &rows); err != nil {
		t.Fatalf("%v\n%s", err, e.stdout)
	}
	d := rows[0].Instances[0].Summary.Disk
	if d == nil || d.UsedBytes != 83886080 || d.CapacityBytes != 100663296 || d.CeilingPercent != 80 {
		t.Errorf("n1's disk in -o json: %+v", d)
	}
	if d := rows[3].Instances[0].Summary.Disk; d == nil || d.Unknown != "image filesystem capacity unknown: kubelet stats: 403 Forbidden" {
		t.Errorf("n4's whole cause in -o json: %+v", d)
	}
	if rows[2].Instances[0].Summary.Disk != nil {
		t.Errorf("n3 has no disk reading, got %+v", rows[2].Instances[0].Summary.Disk)
	}
}
