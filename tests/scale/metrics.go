package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// requestKey is one series of apiserver_request_total, with the labels
// that tell who is asking for what.
type requestKey struct {
	Verb, Resource, Subresource, Code string
}

func (k requestKey) String() string {
	r := k.Resource
	if k.Subresource != "" {
		r += "/" + k.Subresource
	}
	if r == "" {
		r = "(non-resource)"
	}
	return fmt.Sprintf("%s %s %s", k.Verb, r, k.Code)
}

// scrape is apiserver_request_total at one moment, summed over the
// labels not in requestKey.
type scrape struct {
	at     time.Time
	counts map[requestKey]float64
	// cpu is the apiserver's process_cpu_seconds_total.
	cpu float64
	// leaseWatches is how many Lease watches are open
	// (apiserver_longrunning_requests); found says the gauge was there.
	leaseWatches float64
	found        bool
	// heartbeats is how many node Lease renewals the harness had made,
	// heartbeatOthers its other node Lease requests (heartbeat.go).
	heartbeats, heartbeatOthers float64
}

const (
	requestMetric = "apiserver_request_total"
	cpuMetric     = "process_cpu_seconds_total"
	// openMetric counts the long-running requests open now. The request
	// counter counts a watch when it ends; with this gauge the watches
	// are counted when they start, which is when the waiter asked.
	openMetric = "apiserver_longrunning_requests"
)

// scrapeRequests reads the apiserver's own /metrics.
func scrapeRequests(ctx context.Context, rc rest.Interface) (scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	body, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	at := time.Now()
	if err != nil {
		return scrape{}, fmt.Errorf("scrape apiserver /metrics: %w", err)
	}
	sc, err := parseRequests(body)
	sc.at = at
	if err == nil && !sc.found {
		err = fmt.Errorf("apiserver /metrics has no %s", openMetric)
	}
	return sc, err
}

// scrapeAPI is scrapeRequests with the node heartbeat requests made so far.
func (h *harness) scrapeAPI(ctx context.Context, rc rest.Interface) (scrape, error) {
	s, err := scrapeRequests(ctx, rc)
	s.heartbeats, s.heartbeatOthers = float64(h.hb.beats.Load()), float64(h.hb.others.Load())
	return s, err
}

// parseRequests picks the apiserver_request_total samples out of the
// Prometheus text format. Only that metric is parsed: the whole page is
// megabytes of histograms, and the scrape runs during the measurement.
func parseRequests(body []byte) (scrape, error) {
	out := scrape{counts: map[requestKey]float64{}}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, cpuMetric+" "); ok {
			out.cpu, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
			continue
		}
		metric, rest, ok := strings.Cut(line, "{")
		if !ok || metric != requestMetric && metric != openMetric {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			return scrape{}, fmt.Errorf("malformed sample %q", line)
		}
		labels := parseLabels(rest[:end])
		v, err := strconv.ParseFloat(strings.Fields(rest[end+1:])[0], 64)
		if err != nil {
			return scrape{}, fmt.Errorf("sample %q: %w", line, err)
		}
		if metric == openMetric {
			out.found = true
			if labels["verb"] == "WATCH" && labels["resource"] == "leases" {
				out.leaseWatches += v
			}
			continue
		}
		k := requestKey{Verb: labels["verb"], Resource: labels["resource"], Subresource: labels["subresource"], Code: labels["code"]}
		out.counts[k] += v
	}
	return out, sc.Err()
}

// parseLabels reads name="value",... (the values here hold no quotes).
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			break
		}
		name := s[:eq]
		rest := s[eq+2:]
		q := strings.IndexByte(rest, '"')
		if q < 0 {
			break
		}
		out[name] = rest[:q]
		s = strings.TrimPrefix(rest[q+1:], ",")
	}
	return out
}

// RequestRate is one series' requests per second over a window.
type RequestRate struct {
	Key  requestKey
	Rate float64
}

// Requests are the apiserver's requests over a window, by series.
type Requests struct {
	Seconds float64
	Rates   []RequestRate
	// CPU is the apiserver's CPU use over the window, in cores.
	CPU float64
	// LeaseWatchStarts is the Lease watches started per second: those
	// that ended plus those still open at the end, less those open at
	// the start.
	LeaseWatchStarts float64
	// Heartbeats is the node Lease renewals per second (heartbeat.go):
	// successful Lease writes that are not the slots'; HeartbeatOthers
	// the other node Lease requests, which are not the waiters'.
	Heartbeats, HeartbeatOthers float64
}

// diff is the rate of every series between two scrapes, busiest first.
func diff(a, b scrape) Requests {
	secs := b.at.Sub(a.at).Seconds()
	r := Requests{Seconds: secs}
	if secs <= 0 {
		return r
	}
	r.CPU = (b.cpu - a.cpu) / secs
	r.Heartbeats = (b.heartbeats - a.heartbeats) / secs
	r.HeartbeatOthers = (b.heartbeatOthers - a.heartbeatOthers) / secs
	ended := 0.0
	for k, v := range b.counts {
		if k.Verb == "WATCH" && k.Resource == "leases" {
			ended += v - a.counts[k]
		}
	}
	r.LeaseWatchStarts = max(ended+b.leaseWatches-a.leaseWatches, 0) / secs
	for k, v := range b.counts {
		if d := v - a.counts[k]; d > 0 {
			r.Rates = append(r.Rates, RequestRate{Key: k, Rate: d / secs})
		}
	}
	sort.Slice(r.Rates, func(i, j int) bool {
		if r.Rates[i].Rate != r.Rates[j].Rate {
			return r.Rates[i].Rate > r.Rates[j].Rate
		}
		return r.Rates[i].Key.String() < r.Rates[j].Key.String()
	})
	return r
}

// Total is all requests per second on API resources (the scrapes of
// /metrics themselves are left out).
func (r Requests) Total() float64 {
	t := 0.0
	for _, x := range r.Rates {
		if x.Key.Resource != "" {
			t += x.Rate
		}
	}
	return t
}

// Waiters is the part of the Lease traffic that waiting costs: every
// Lease request except the writes that succeeded (a holder taking,
// renewing or clearing its slot). Reads, lists, watches and the writes
// refused with 409 Conflict all come from nodes that wait. Watches count
// when they start: a waiter's watch ends when it takes a slot, which is
// the taking's doing, not the waiting's.
func (r Requests) Waiters() float64 {
	t := r.LeaseWatchStarts - r.HeartbeatOthers
	for _, x := range r.Rates {
		if x.Key.Resource == "leases" && x.Key.Verb != "WATCH" && !isWrite2xx(x.Key) {
			t += x.Rate
		}
	}
	return max(t, 0)
}

// Holders is the slot Lease writes that succeeded: all successful Lease
// writes but the node heartbeats.
func (r Requests) Holders() float64 {
	t := -r.Heartbeats
	for _, x := range r.Rates {
		if x.Key.Resource == "leases" && isWrite2xx(x.Key) {
			t += x.Rate
		}
	}
	return max(t, 0)
}

// Labels is the Node patches (the agents' labels).
func (r Requests) Labels() float64 {
	t := 0.0
	for _, x := range r.Rates {
		if x.Key.Resource == "nodes" && x.Key.Verb == "PATCH" {
			t += x.Rate
		}
	}
	return t
}

func isWrite2xx(k requestKey) bool {
	switch k.Verb {
	case "POST", "PUT", "PATCH", "DELETE":
		return strings.HasPrefix(k.Code, "2")
	}
	return false
}
