package scale

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A lone joiner's wait and requests, from its agent's events.
func TestJoiner(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ev := func(d time.Duration, kind, value string) event {
		return event{T: t0.Add(d).UnixNano(), Agent: 7, Kind: kind, Slot: -1, Value: value}
	}
	started := []event{ev(0, evStart, ""), ev(10*time.Millisecond, evWait, "")}
	for _, tc := range []struct {
		name     string
		events   []event
		failList bool
		want     Joiner
		err      string
	}{
		{name: "answered", events: append(started[:2:2], ev(1500*time.Millisecond, evHold, "3"), ev(2*time.Second, evRelease, ""), ev(3*time.Second, evHold, "9")),
			want: Joiner{Wait: 1500 * time.Millisecond, Requests: 3}},
		{name: "first list 503", failList: true, events: append(started[:2:2], ev(20*time.Millisecond, evListFailed, ""), ev(41*time.Second, evHold, "4")),
			want: Joiner{FailedFirstList: true, Wait: 41 * time.Second, Requests: 4}},
		{name: "the 503 never came", failList: true, events: append(started[:2:2], ev(time.Second, evHold, "2")), err: "0 lists answered 503, want 1"},
		{name: "a 503 it should not see", events: append(started[:2:2], ev(20*time.Millisecond, evListFailed, ""), ev(time.Second, evHold, "2")), err: "1 lists answered 503, want none"},
		{name: "never held", events: started, err: "never held a slot"},
		{name: "never started", events: started[1:], err: "never started"},
		{name: "agent failed", events: append(started[:2:2], ev(time.Second, evFailed, "forbidden")), err: "its agent failed: forbidden"},
		{name: "hold without a count", events: append(started[:2:2], ev(time.Second, evHold, "")), err: "without its request count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := joiner(tc.events, tc.failList)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("joiner: %+v, %v; want error %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("joiner: %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseJoin(t *testing.T) {
	c, err := ParseConfig("n1000-k50-seed1-join")
	if want := (Config{Nodes: 1000, Slots: 50, SeedNodes: 1, Join: true}); err != nil || c != want || c.allNodes() != 1002 {
		t.Errorf("ParseConfig: %+v, %v (all nodes %d); want %+v and 1002", c, err, c.allNodes(), want)
	}
	for _, bad := range []string{"n10-k2-join-seed1", "n10-k2-joined", "n10-k2-join-join"} {
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("ParseConfig(%q) succeeded", bad)
		}
	}
}

// The joiners reach the report: its JSON, its table (before → after when
// the before report has the same run) and its checks. A report of an
// older harness, without joiners, still reads and compares.
func TestJoinersReport(t *testing.T) {
	cfg := Config{Nodes: 10, Slots: 2, Join: true}
	after := Run{Config: cfg, PeakHeldAgents: 2, Joiners: []Joiner{
		{Wait: 1200 * time.Millisecond, Requests: 3, Label: "succeeded"},
		{FailedFirstList: true, Wait: 2500 * time.Millisecond, Requests: 5, Label: "succeeded"},
	}}
	data, err := json.Marshal(Report{Runs: []Run{after}})
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Runs[0].Config != cfg || len(back.Runs[0].Joiners) != 2 || back.Runs[0].Joiners[1] != after.Joiners[1] {
		t.Errorf("read back %+v, want %+v", back.Runs[0], after)
	}
	var old Report // an older harness's JSON: no Join, no Joiners
	if err := json.Unmarshal([]byte(`{"Runs":[{"Config":{"Nodes":10,"Slots":2,"SeedNodes":0,"Outage":0,"Throttle":0,"LostAnswers":0,"Shrink":0},"PeakHeldAgents":2}]}`), &old); err != nil {
		t.Fatal(err)
	}
	if c := old.Runs[0].Config; c != (Config{Nodes: 10, Slots: 2}) || old.Runs[0].Joiners != nil {
		t.Errorf("older report read as %+v", old.Runs[0])
	}
	if data, _ := json.Marshal(old.Runs[0].Config); strings.Contains(string(data), "Join") {
		t.Errorf("a run without joiners writes %s", data)
	}

	before := after
	before.Joiners = []Joiner{
		{Wait: 15 * time.Second, Requests: 4, Label: "succeeded"},
		{FailedFirstList: true, Wait: 41 * time.Second, Requests: 6, Label: "succeeded"},
	}
	rep := Report{Options: Options{Images: []Image{{Size: 1}}, Capacity: 1, NodeCap: 1}, Runs: []Run{after, {Config: Config{Nodes: 10, Slots: 2}}},
		Before: &Report{Runs: []Run{before}}}
	md := rep.Markdown()
	for _, want := range []string{
		"| n10-k2-join | first list answered | 15.0 s → 1.20 s | 4 → 3 | succeeded → succeeded |",
		"| n10-k2-join | first list 503 | 41.0 s → 2.50 s | 6 → 5 | succeeded → succeeded |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "| n10-k2-join | first list") != 2 {
		t.Errorf("want one line per joiner:\n%s", md)
	}
	rep.Runs[0].Joiners[1].Wait = 31 * time.Second
	var verdicts []string
	for _, c := range rep.Checks() {
		if strings.Contains(c.Target, "lone joiner") {
			verdicts = append(verdicts, c.Verdict())
		}
	}
	if strings.Join(verdicts, ",") != "met,NOT met" {
		t.Errorf("joiner checks %q, want met for the first and NOT met for a 31 s wait", verdicts)
	}
}

// The joiners' pull times come after the herd's: a -join run's herd pulls
// as the same run without joiners does.
func TestJoinerPullCaps(t *testing.T) {
	o := Options{Images: []Image{{Size: 100 * MiB}}, PullSeconds: [2]float64{15, 60}}
	herd, all := o.pullCaps(50), o.pullCaps(Config{Nodes: 50, Slots: 5, Join: true}.allNodes())
	if len(all) != 52 {
		t.Fatalf("%d pull times for 50 nodes and 2 joiners", len(all))
	}
	for n, c := range herd {
		if all[n] != c {
			t.Errorf("node %s pulls at %.0f B/s with joiners, %.0f B/s without", n, all[n], c)
		}
	}
}
