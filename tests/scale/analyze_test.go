package scale

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	for _, c := range append(DefaultConfigs(), Config{Nodes: 3, Slots: 2, SeedNodes: 1, Outage: time.Minute, LostAnswers: 5}) {
		got, err := ParseConfig(c.Name())
		if err != nil || got != c {
			t.Errorf("ParseConfig(%q) = %+v, %v; want %+v", c.Name(), got, err, c)
		}
	}
	for _, bad := range []string{"", "n10", "k10-n10", "n10-k2-poll", "n10-k2-outage", "n10-k2-lost", "n0-k1"} {
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("ParseConfig(%q) succeeded", bad)
		}
	}
}

// The throttled run's backoff: takes answered 429 per waiting node in
// each third of the throttle.
func TestAnalyzeThrottle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	cfg := Config{Nodes: 2, Slots: 1, Throttle: 30 * time.Second}
	var events []event
	for a := range 2 {
		events = append(events, event{T: at(0), Agent: a, Kind: evWait})
	}
	// Each of the 2 waiters fails at 20.5, 21.5, 23.5, 27.5 s and 35.5 s
	// (gaps doubling); the throttle lasts 20-50 s.
	for _, s := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 3500 * time.Millisecond, 7500 * time.Millisecond, 15500 * time.Millisecond} {
		for a := range 2 {
			events = append(events, event{T: at(20*time.Second + s), Agent: a, Kind: evThrottled})
		}
	}
	run := analyze(cfg, Options{Capacity: 1, NodeCap: 1, Images: []Image{{Size: 1}}}, t0, t0.Add(time.Minute), events, nil, faultTimes{20 * time.Second, 50 * time.Second})
	if run.Throttled != [3]float64{4, 1, 0} || run.Backoff() != 0 {
		t.Errorf("throttled per waiting node by third %v, backoff %v; want [4 1 0] and 0", run.Throttled, run.Backoff())
	}
}

// After the herd shrinks, the longest a free slot waits for one of the
// nodes still waiting.
func TestShrinkIdle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ev := func(d time.Duration, agent int, kind string, slot int) event {
		return event{T: t0.Add(d).UnixNano(), Agent: agent, Kind: kind, Slot: slot}
	}
	events := []event{
		ev(0, 0, evWait, -1), ev(0, 1, evWait, -1), ev(0, 2, evWait, -1), ev(0, 3, evWait, -1),
		ev(time.Second, 0, evHold, 0), ev(time.Second, 1, evHold, 1),
		ev(10*time.Second, 3, evLeft, -1), // the shrink: agent 2 stays
		ev(12*time.Second, 0, evRelease, 0),
		ev(15*time.Second, 2, evHold, 0), // slot 0 idled 3 s while agent 2 waited
		ev(16*time.Second, 4, evWait, -1),
		ev(20*time.Second, 1, evRelease, 1),
		ev(27*time.Second, 4, evHold, 1), // 7 s
	}
	if got := shrinkIdle(2, events, t0, 10*time.Second); got != 7*time.Second {
		t.Errorf("longest idle %v, want 7s", got)
	}
}

// A report read back from its JSON (make scale -json, then -before) is
// the one written.
func TestReportJSON(t *testing.T) {
	rep := Report{Options: Options{Configs: DefaultConfigs()}, Runs: []Run{{Config: DefaultConfigs()[0], PeakPulling: 3, Throttled: [3]float64{1, 2, 3}, Fault: faultTimes{time.Second, 2 * time.Second}}}, Load: "1.00, 2.00, 3.00"}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Runs[0].PeakPulling != 3 || back.Runs[0].Throttled != rep.Runs[0].Throttled || back.Runs[0].Fault != rep.Runs[0].Fault || back.Load != rep.Load {
		t.Errorf("read back %+v, want %+v", back.Runs[0], rep.Runs[0])
	}
}

// A target the run cannot compute says so: neither met nor not met.
func TestChecksThatCannotTell(t *testing.T) {
	rep := Report{Runs: []Run{
		{Config: Config{Nodes: 10, Slots: 2, Throttle: time.Second}, PeakHeldAgents: 2, Fault: faultTimes{time.Second, 2 * time.Second}},
		{Config: Config{Nodes: 10, Slots: 2}, PeakHeldAgents: 2, Ideal: time.Second, Last: time.Second},
	}}
	var unknown []string
	for _, c := range rep.Checks() {
		if c.Unknown {
			if c.OK || c.Verdict() != "cannot tell" {
				t.Errorf("%s: %q is unknown but says %q (OK %v)", c.Run, c.Target, c.Verdict(), c.OK)
			}
			unknown = append(unknown, c.Run+": "+c.Value)
		}
	}
	want := []string{
		"n10-k2-throttle1s: no take was answered 429 in the first third",
		"n10-k2: no node waited in the steady-state window",
		"n10-k2: no count: no node waited, or a report from before the count",
		"n10-k2: no hand-over while nodes waited",
	}
	if !slices.Equal(unknown, want) {
		t.Errorf("checks that cannot tell: %q, want %q", unknown, want)
	}
}

// An outage run's recovery: when all K slots are held again after the
// outage's losses.
func TestAnalyzeRefill(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ev := func(d time.Duration, agent int, kind string, slot int) event {
		return event{T: t0.Add(d).UnixNano(), Agent: agent, Kind: kind, Slot: slot}
	}
	events := []event{
		ev(0, 0, evHold, 0), ev(0, 1, evHold, 1),
		ev(30*time.Second, 0, evLost, 0), ev(30*time.Second, 1, evLost, 1),
		ev(52*time.Second, 2, evHold, 0), ev(55*time.Second, 3, evHold, 1),
	}
	run := analyze(Config{Nodes: 4, Slots: 2, Outage: 30 * time.Second}, Options{Capacity: 1, NodeCap: 1, Images: []Image{{Size: 1}}}, t0, t0.Add(time.Minute), events, nil, faultTimes{20 * time.Second, 50 * time.Second})
	if run.Refilled != 55*time.Second || run.Lost != 2 {
		t.Errorf("refilled at %v after %d losses, want 55s after 2", run.Refilled, run.Lost)
	}
}

// The propagation counts only the writes seen inside the window.
func TestPropagationInWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lw := &leaseWatch{}
	for i := range 100 {
		lw.seen = append(lw.seen, propagation{t0.Add(time.Duration(i) * time.Second), time.Duration(i+1) * time.Millisecond})
	}
	lw.seen = append(lw.seen, propagation{t0.Add(-time.Second), time.Hour}, propagation{t0.Add(100 * time.Second), time.Hour})
	if p50, p99 := lw.Propagation(t0, t0.Add(100*time.Second)); p50 != 50*time.Millisecond || p99 != 99*time.Millisecond {
		t.Errorf("p50 %v p99 %v, want 50ms and 99ms, the hand-overs' percentiles (the writes outside the window left out)", p50, p99)
	}
	if p50, p99 := (&leaseWatch{}).Propagation(t0, t0.Add(time.Second)); p50 != 0 || p99 != 0 {
		t.Errorf("no writes: p50 %v p99 %v, want 0", p50, p99)
	}
}
