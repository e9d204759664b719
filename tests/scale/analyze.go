package scale

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"
)

// ProcUsage is what the agents processes of a run used, from getrusage.
type ProcUsage struct {
	// CPU is user plus system time of all agents processes.
	CPU time.Duration
	// MaxRSS is each process's peak resident set, in bytes.
	MaxRSS []int64
}

// Run is the outcome of one configuration.
type Run struct {
	Config Config
	Ideal  time.Duration
	// Last is when the last node was labeled, from the start.
	Last time.Duration
	// Completions are the label times, sorted.
	Completions []time.Duration
	// Succeeded and Failed count the labels read back from the API.
	Succeeded, Failed int
	// AgentFailures counts agents that ended without writing a label.
	AgentFailures int
	// PeakHeldAgents is the most slots held at once by the agents' own
	// account (from Hold returning to Release starting, which lies inside
	// the time the Lease names the holder); PeakHeldAPI the most Leases
	// with a holder at once, watched from the API.
	PeakHeldAgents, PeakHeldAPI int
	// WatchRestarts is how often the apiserver ended the harness's own
	// watch on the Leases (it lists again; a list is a sample too).
	WatchRestarts int
	// PropagationP50 and P99: how long a slot write took, in the steady
	// state, from its writer's stamp to the harness's watch.
	PropagationP50, PropagationP99 time.Duration `json:",omitempty"`
	// Lost counts slots lost while held.
	Lost int
	// HandOvers are the slot hand-overs counted (see analyze), with their
	// latency percentiles; HandOverMissing those never taken again.
	HandOvers                             int
	HandOverP50, HandOverP99, HandOverMax time.Duration
	HandOverMissing                       int
	// Whole is the apiserver's requests over the whole run, Window over
	// the steady state: the middle half of the run.
	Whole, Window Requests
	// WindowStart and WindowEnd bound Window, from the start.
	WindowStart, WindowEnd time.Duration
	// WindowWaiting is the mean number of nodes waiting for a slot in
	// the window, WindowHolds the slots taken in it.
	WindowWaiting float64
	WindowHolds   int
	Usage         ProcUsage
	// Served and Needed are the registry's bytes; Cancelled counts the
	// transfers cut short.
	Served, Needed int64
	Cancelled      int
	// PeakPulling is the most nodes pulling at once, as the registry saw
	// them (a transfer in progress).
	PeakPulling int
	// Fault is when the run's fault began and ended, from the start; Left
	// counts the agents that left (shrink, the end of an outage run), and
	// AnswersLost the takes whose answer was lost.
	Fault       faultTimes
	Left        int
	AnswersLost int
	// Refilled is, in an outage run, when all K slots were held again
	// after slots were lost, from the start; 0 if never.
	Refilled time.Duration
	// Throttled are the takes answered 429 in each third of the throttle,
	// per node waiting then (the mean over that third).
	Throttled [3]float64
	// ShrinkIdle is, after the herd shrank, the longest a free slot stayed
	// free while a node waited.
	ShrinkIdle time.Duration
	// FirstHold and AllWaiting are when the first slot was held and when
	// every agent had asked for one, from the start.
	FirstHold, AllWaiting time.Duration
	// WatchEvents is the events the agents' own Lease watches delivered
	// to them over the run, and WaitingSeconds the time they spent
	// waiting for a slot, summed over the agents (watchcount.go).
	WatchEvents    int64
	WaitingSeconds float64
	// Joiners are the nodes that joined alone after the herd (Config.Join).
	Joiners []Joiner `json:",omitempty"`
}

// PeakHolders is the most holders by any of the three counts.
func (r Run) PeakHolders() int { return max(r.PeakHeldAgents, r.PeakHeldAPI, r.PeakPulling) }

// Cut says whether the run was ended early (an outage run), so that its
// time to the last label means nothing.
func (r Run) Cut() bool { return r.Config.Outage > 0 }

// Backoff is the throttled takes per waiting node in the last third of
// the throttle over those in the first: well under 1 when a failed take
// backs off.
func (r Run) Backoff() float64 {
	if r.Throttled[0] == 0 {
		return math.NaN()
	}
	return r.Throttled[2] / r.Throttled[0]
}

// Ratio is Last over Ideal.
func (r Run) Ratio() float64 { return r.Last.Seconds() / r.Ideal.Seconds() }

// PerWaiterMinute is the waiters' requests per waiting node per minute in
// the window.
func (r Run) PerWaiterMinute() float64 {
	if r.WindowWaiting <= 0 {
		return math.NaN()
	}
	return r.Window.Waiters() * 60 / r.WindowWaiting
}

// WatchPerWaiterMinute is the watch events the agents' own watches
// delivered per waiting node per minute, over the whole run: an agent
// watches only while it waits.
func (r Run) WatchPerWaiterMinute() float64 {
	if r.WaitingSeconds <= 0 {
		return math.NaN()
	}
	return float64(r.WatchEvents) * 60 / r.WaitingSeconds
}

// PerHold is the waiters' requests in the window per slot taken in it:
// what each hand-over costs (the taker's watch ending, lost races), as
// opposed to what waiting costs while nothing changes.
func (r Run) PerHold() float64 {
	if r.WindowHolds == 0 {
		return math.NaN()
	}
	return r.Window.Waiters() * r.Window.Seconds / float64(r.WindowHolds)
}

// CPUPerAgent is CPU time per agent over the run.
func (r Run) CPUPerAgent() time.Duration {
	return r.Usage.CPU / time.Duration(max(r.Config.Nodes, 1))
}

// RSSPerAgent is the agents processes' peak RSS, summed, per agent.
func (r Run) RSSPerAgent() int64 {
	var t int64
	for _, m := range r.Usage.MaxRSS {
		t += m
	}
	return t / int64(max(r.Config.Nodes, 1))
}

// analyze turns the agents' events and the scrapes into a Run. t0 is when
// the agents were started, end when the last one returned.
func analyze(cfg Config, opts Options, t0, end time.Time, events []event, scrapes []scrape, ft faultTimes) *Run {
	run := &Run{Config: cfg, Ideal: opts.Ideal(cfg), Fault: ft}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.T, b.T) })
	rel := func(t int64) time.Duration { return time.Unix(0, t).Sub(t0) }

	waiting := map[int]bool{}
	holder := map[int]int{} // slot -> agent
	pending := map[int]time.Duration{}
	var lat []time.Duration
	steps := []step{{0, 0}}
	waits := 0
	setWaiting := func(at time.Duration, a int, w bool) {
		if waiting[a] == w {
			return
		}
		if w {
			waiting[a] = true
		} else {
			delete(waiting, a)
		}
		steps = append(steps, step{at, len(waiting)})
	}
	endHold := func(slot, agent int) bool {
		if h, ok := holder[slot]; ok && h == agent {
			delete(holder, slot)
			return true
		}
		return false
	}
	for _, ev := range events {
		at := rel(ev.T)
		switch ev.Kind {
		case evWait:
			setWaiting(at, ev.Agent, true)
			if waits++; waits == cfg.Nodes {
				run.AllWaiting = at
			}
		case evHold:
			if run.FirstHold == 0 {
				run.FirstHold = at
			}
			setWaiting(at, ev.Agent, false)
			holder[ev.Slot] = ev.Agent
			run.PeakHeldAgents = max(run.PeakHeldAgents, len(holder))
			if cfg.Outage > 0 && run.Lost > 0 && run.Refilled == 0 && len(holder) == cfg.Slots {
				run.Refilled = at
			}
			if since, ok := pending[ev.Slot]; ok {
				lat = append(lat, at-since)
				delete(pending, ev.Slot)
			}
		case evLost:
			run.Lost++
			endHold(ev.Slot, ev.Agent)
		case evRelease:
			if !endHold(ev.Slot, ev.Agent) {
				continue // lost before
			}
			// A hand-over is counted when the waiters outnumber the free
			// slots: then every free slot should be taken at once. With
			// fewer waiters (the end of the run) a slot may rightly stay
			// free.
			if free := cfg.Slots - len(holder); len(waiting) >= free {
				pending[ev.Slot] = at
			}
		case evLabeled:
			run.Completions = append(run.Completions, at)
		case evFailed:
			setWaiting(at, ev.Agent, false)
			run.AgentFailures++
		case evLeft:
			setWaiting(at, ev.Agent, false)
			run.Left++
		case evAnswerLost:
			run.AnswersLost++
		case evWatched:
			n, err := strconv.ParseInt(ev.Value, 10, 64)
			if err == nil {
				run.WatchEvents += n
			}
		case evThrottled:
			if third := int(3 * (at - ft.Start) / max(ft.End-ft.Start, 1)); cfg.Throttle > 0 && third >= 0 && third < 3 {
				run.Throttled[third]++
			}
		}
	}
	if cfg.Throttle > 0 && ft.Start > 0 {
		for i := range run.Throttled {
			third := (ft.End - ft.Start) / 3
			from := ft.Start + time.Duration(i)*third
			if w := meanWaiting(steps, from, from+third); w > 0 {
				run.Throttled[i] /= w
			}
		}
	}
	if cfg.Shrink > 0 && ft.Start > 0 {
		run.ShrinkIdle = shrinkIdle(cfg.Slots, events, t0, ft.Start)
	}
	if len(events) > 0 {
		last := rel(events[len(events)-1].T)
		run.WaitingSeconds = meanWaiting(steps, 0, last) * last.Seconds()
	}
	run.HandOverMissing = len(pending)
	run.HandOvers = len(lat)
	slices.Sort(lat)
	if len(lat) > 0 {
		run.HandOverP50 = percentile(lat, 0.50)
		run.HandOverP99 = percentile(lat, 0.99)
		run.HandOverMax = lat[len(lat)-1]
	}
	slices.Sort(run.Completions)
	if n := len(run.Completions); n > 0 {
		run.Last = run.Completions[n-1]
	} else {
		run.Last = end.Sub(t0)
	}

	if len(scrapes) >= 2 {
		run.Whole = diff(scrapes[0], scrapes[len(scrapes)-1])
		a, b := window(scrapes, t0.Add(run.Last/4), t0.Add(run.Last*3/4))
		run.Window = diff(a, b)
		run.WindowStart, run.WindowEnd = a.at.Sub(t0), b.at.Sub(t0)
		run.WindowWaiting = meanWaiting(steps, run.WindowStart, run.WindowEnd)
		for _, ev := range events {
			if at := rel(ev.T); ev.Kind == evHold && at >= run.WindowStart && at < run.WindowEnd {
				run.WindowHolds++
			}
		}
	}
	return run
}

// step is the number of waiting nodes from a time on.
type step struct {
	at time.Duration
	n  int
}

// meanWaiting is the time-weighted mean of the waiting count over [from, to).
func meanWaiting(steps []step, from, to time.Duration) float64 {
	area := 0.0
	for i, s := range steps {
		next := to
		if i+1 < len(steps) {
			next = min(steps[i+1].at, to)
		}
		if start := max(s.at, from); next > start {
			area += float64(s.n) * (next - start).Seconds()
		}
	}
	if d := (to - from).Seconds(); d > 0 {
		return area / d
	}
	return 0
}

// shrinkIdle is, from shrunk on, the longest a free slot stayed free while
// some node waited: from when both were so (the later of the two) until
// the slot was taken, or no node waited any more.
func shrinkIdle(k int, events []event, t0 time.Time, shrunk time.Duration) time.Duration {
	held, waiting := map[int]bool{}, map[int]bool{}
	freeSince := map[int]time.Duration{}
	var waitingSince, longest, at time.Duration
	measure := func(slot int) {
		if len(waiting) > 0 && at > shrunk {
			longest = max(longest, at-max(freeSince[slot], waitingSince, shrunk))
		}
	}
	stopWaiting := func(agent int) {
		if waiting[agent] && len(waiting) == 1 {
			for s := range k { // the last waiting node is gone: the free slots idled until now
				if !held[s] {
					measure(s)
				}
			}
		}
		delete(waiting, agent)
	}
	for _, ev := range events {
		at = time.Unix(0, ev.T).Sub(t0)
		switch ev.Kind {
		case evWait:
			if len(waiting) == 0 {
				waitingSince = at
			}
			waiting[ev.Agent] = true
		case evHold:
			measure(ev.Slot)
			held[ev.Slot] = true
			stopWaiting(ev.Agent)
		case evLost, evRelease:
			if held[ev.Slot] {
				delete(held, ev.Slot)
				freeSince[ev.Slot] = at
			}
		case evFailed, evLeft:
			stopWaiting(ev.Agent)
		}
	}
	for s := range k { // nodes still waiting at the end, with free slots
		if !held[s] {
			measure(s)
		}
	}
	return longest
}

// window picks the scrapes nearest to from and to, distinct and in order.
func window(scrapes []scrape, from, to time.Time) (scrape, scrape) {
	nearest := func(t time.Time) int {
		best := 0
		for i, s := range scrapes {
			if absDur(s.at.Sub(t)) < absDur(scrapes[best].at.Sub(t)) {
				best = i
			}
		}
		return best
	}
	i, j := nearest(from), nearest(to)
	if j <= i {
		j = min(i+1, len(scrapes)-1)
		if j == i {
			i = max(j-1, 0)
		}
	}
	return scrapes[i], scrapes[j]
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
