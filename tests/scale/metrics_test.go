package scale

import (
	"testing"
	"time"
)

// TestRequestShares splits two scrapes' Lease traffic into the waiters'
// requests and the holders' writes. The node heartbeats the harness made
// are Lease requests too, and belong to neither.
func TestRequestShares(t *testing.T) {
	put200 := requestKey{Verb: "PUT", Resource: "leases", Code: "200"}
	put409 := requestKey{Verb: "PUT", Resource: "leases", Code: "409"}
	watch := requestKey{Verb: "WATCH", Resource: "leases", Code: "200"}
	t0 := time.Unix(0, 0)
	a := scrape{at: t0, counts: map[requestKey]float64{put200: 100, put409: 10, watch: 5}, leaseWatches: 1000, heartbeats: 50, heartbeatOthers: 2}
	b := scrape{at: t0.Add(10 * time.Second), counts: map[requestKey]float64{put200: 1300, put409: 40, watch: 25}, leaseWatches: 990, heartbeats: 1050, heartbeatOthers: 12}
	r := diff(a, b)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"heartbeats/s", r.Heartbeats, 100},
		{"holder writes/s: 120 Lease writes/s less 100 heartbeats", r.Holders(), 20},
		// 3 conflicts a second, of which 1 a heartbeat's, and 1 watch a
		// second started: 2 ended, 1 fewer open.
		{"waiter requests/s", r.Waiters(), 3},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}
