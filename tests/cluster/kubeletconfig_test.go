package cluster

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Options.KubeletConfig replaces whole top-level fields and keeps the rest.
func TestWithFields(t *testing.T) {
	base := "kind: KubeletConfiguration\nevictionHard:\n  nodefs.available: \"1%\"\n  imagefs.available: \"1%\"\nimageGCHighThresholdPercent: 100\n"
	out, err := withFields(base, map[string]any{
		"evictionHard":      map[string]string{"imagefs.available": "45%"},
		"imageMinimumGCAge": "1s",
	})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	eh, _ := got["evictionHard"].(map[string]any)
	if len(eh) != 1 || eh["imagefs.available"] != "45%" || got["imageMinimumGCAge"] != "1s" ||
		got["imageGCHighThresholdPercent"] != float64(100) || got["kind"] != "KubeletConfiguration" {
		t.Errorf("got:\n%s", out)
	}
	if same, _ := withFields(base, nil); same != base {
		t.Errorf("no fields changed the document:\n%s", same)
	}
	if _, err := withFields("a: [", map[string]any{"b": 1}); err == nil || !strings.Contains(err.Error(), "parse") {
		t.Errorf("err = %v, want a parse error", err)
	}
}
