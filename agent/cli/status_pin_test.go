package cli

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// status shows the pins of each node against the budget, and says where
// the runtime cannot pin; -o json carries the same numbers.
func TestStatusPins(t *testing.T) {
	e := newEnv(t)
	const key = "image-prefetcher.stackrox.io/web"
	pinned := `{"total":3,"present":3,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z","pins":{"images":2,"bytes":1610612736,"budgetBytes":4294967296,"notPinned":[{"image":"big:1","reason":"OverBudget","message":"takes 5.0 GiB"}]}}`
	unsupported := `{"total":3,"present":3,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z","pins":{"images":0,"bytes":0,"budgetBytes":0,"unsupported":"containerd 1.6.20~ds1 keeps a pin label ..."}}`
	plain := `{"total":3,"present":3,"failed":[],"durationSeconds":1,"completedAt":"2026-01-01T00:00:00Z"}`
	mk := func(name, ann string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{key: "succeeded"}, Annotations: map[string]string{key: ann}}}
	}
	e.kube = fake.NewClientset(mk("n1", pinned), mk("n2", unsupported), mk("n3", plain))
	if code := e.run("status"); code != 0 {
		t.Errorf("exit %d", code)
	}
	want := `NODE  INSTANCE  STATE      OWNER  PRESENT  PINNED                                            FAILURES
n1    web       succeeded  -      3/3      2, 1.5 GiB of 4.0 GiB, 1 not pinned (OverBudget)  -
n2    web       succeeded  -      3/3      pinning unsupported                               -
n3    web       succeeded  -      3/3      -                                                 -
`
	if got := e.stdout.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}

	j := newEnv(t)
	j.kube = e.kube
	j.run("status", "-o", "json")
	var rows []NodeStatus
	if err := json.Unmarshal([]byte(j.stdout.String()), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, e.stdout)
	}
	p1, p2 := rows[0].Instances[0].Summary.Pins, rows[1].Instances[0].Summary.Pins
	if p1 == nil || p1.Images != 2 || p1.Bytes != 1610612736 || p1.BudgetBytes != 4294967296 || p1.NotPinned[0].Reason != "OverBudget" {
		t.Errorf("n1 pins %+v", p1)
	}
	if p2 == nil || p2.Unsupported == "" {
		t.Errorf("n2 pins %+v, want unsupported", p2)
	}
	if rows[2].Instances[0].Summary.Pins != nil {
		t.Errorf("n3 pins %+v, want none", rows[2].Instances[0].Summary.Pins)
	}
}

func TestPinCell(t *testing.T) {
	for _, tc := range []struct {
		name string
		pins *label.Pins
		want string
	}{
		{"no pins reported", nil, "-"},
		{"unsupported", &label.Pins{Unsupported: "containerd 1.6.20"}, "pinning unsupported"},
		{"within the budget", &label.Pins{Images: 3, Bytes: 3 << 20, BudgetBytes: 48 << 20}, "3, 3.0 MiB of 48.0 MiB"},
		{"over the budget", &label.Pins{Images: 1, Bytes: 1 << 20, BudgetBytes: 2 << 20, NotPinned: []label.Failure{{Image: "b", Reason: "OverBudget"}}}, "1, 1.0 MiB of 2.0 MiB, 1 not pinned (OverBudget)"},
		{"budget unknown", &label.Pins{Error: "the pin budget is unknown: no mount"}, "none: the pin budget is unknown: no mount"},
		{"budget unknown, pins kept", &label.Pins{Images: 2, Bytes: 3 << 20, Error: "the pin budget is unknown: no mount"},
			"2, 3.0 MiB, error: the pin budget is unknown: no mount"},
		{"a long cause: its first clause", &label.Pins{Error: "the pin budget is unknown: 25% of the image filesystem: image filesystem capacity unknown: kubelet stats: Get \"https://10.0.0.1:10250/stats/summary\": tls: failed to verify certificate: x509: certificate signed by unknown authority"}, "none: the pin budget is unknown"},
		{"error after counting", &label.Pins{Images: 1, Bytes: 1 << 20, BudgetBytes: 2 << 20, Error: "pin b: deadline"}, "1, 1.0 MiB of 2.0 MiB, error: pin b: deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pinCell(&label.Summary{Pins: tc.pins}); got != tc.want {
				t.Errorf("pinCell = %q, want %q", got, tc.want)
			}
		})
	}
}
