package hits

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	since := at("00:00")
	n1 := Node{Node: "n1", Label: "succeeded", Counts: Counts{Hits: 1, Misses: 1, NotCounted: 1}, Pulls: []Pull{
		{Pod: "apps/a", Image: "app:1", Time: at("01:00"), Hit: true, Label: "succeeded"},
		{Pod: "apps/b", Image: "app:2", Time: at("02:00"), Label: "succeeded"},
		{Pod: "apps/c", Image: "app:2", Time: at("03:00"), Label: "unknown"},
	}}
	many := Node{Node: "n2", Label: "failed"}
	for i := 0; i < maxMissLines+1; i++ {
		many.Pulls = append(many.Pulls, Pull{Pod: fmt.Sprintf("apps/p%d", i), Image: "db:1", Time: at("04:00"), Label: "failed"})
	}
	many.NotCounted = len(many.Pulls)
	r := Report{Since: &since, Instances: []Instance{
		{Instance: "db", Images: 1, Counts: Counts{NotCounted: many.NotCounted}, Nodes: []Node{many}},
		{Instance: "lost", Error: "its namespace is not known"},
		{Instance: "web", Images: 2, Counts: n1.Counts, Nodes: []Node{n1}},
	}}
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	var misses strings.Builder
	for i := 0; i < maxMissLines; i++ {
		fmt.Fprintf(&misses, "miss: db on n2 at 2026-01-01T10:04:00Z (label failed, not counted): pod apps/p%d pulled db:1\n", i)
	}
	want := `INSTANCE  NODE   LABEL      HITS  MISSES  NOT-COUNTED
db        (all)  -          0     0       21
db        n2     failed     0     0       21
lost      -      -          -     -       -
web       (all)  -          1     1       1
web       n1     succeeded  1     1       1
` + misses.String() + `miss: db: and 1 more (-o json lists every pull)
lost: no view: its namespace is not known
miss: web on n1 at 2026-01-01T10:02:00Z (label succeeded): pod apps/b pulled app:2
miss: web on n1 at 2026-01-01T10:03:00Z (label unknown, not counted): pod apps/c pulled app:2
Counted: containers started while the node was labeled succeeded; a hit found the image on the node, a miss pulled it (the kubelet's Events, since 2026-01-01T10:00:00Z; the apiserver keeps Events for its --event-ttl, 1h by default).
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// A miss, counted or not, may be a credential verification: the Report
// says so instead of guessing.
func TestNoteMisses(t *testing.T) {
	hit := Node{Node: "n1", Pulls: []Pull{{Hit: true}}}
	miss := Node{Node: "n2", Pulls: []Pull{{Hit: false, Label: LabelUnknown}}}
	for _, tt := range []struct {
		name  string
		nodes []Node
		note  bool
	}{{"hits only", []Node{hit}, false}, {"a miss", []Node{hit, miss}, true}, {"nothing", nil, false}} {
		r := Report{Instances: []Instance{{Instance: "web", Nodes: tt.nodes}}}
		r.noteMisses()
		if (r.Note == VerificationNote) != tt.note || !tt.note && r.Note != "" {
			t.Errorf("%s: note %q", tt.name, r.Note)
		}
	}
}
