package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

var servingRE = regexp.MustCompile(`msg="serving metrics".* addr=(\S+)`)

// metricsAddr waits for the agent to log the address it serves metrics on.
func (e *env) metricsAddr() string {
	e.t.Helper()
	var addr string
	waitFor(e.t, "the metrics server", func() bool {
		m := servingRE.FindStringSubmatch(e.logs.String())
		if m == nil {
			return false
		}
		addr = m[1]
		return true
	})
	return addr
}

// scrape reads /metrics over HTTP into series name{labels} -> value.
func scrape(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	series := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		series[line[:i]] = v
	}
	return series, sc.Err()
}

// has reports whether every wanted series has its value.
func has(got map[string]float64, want map[string]float64) bool {
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return false
		}
	}
	return true
}

// TestFetchServesMetrics scrapes fetch's --metrics-addr during the run and
// after it: attempts by outcome while an image is still being pulled, then
// the images by state.
func TestFetchServesMetrics(t *testing.T) {
	e := newEnv(t)
	const typo, slow = "docker.io/library/typo:1", "quay.io/org/slow:1"
	e.cri.SetBehavior(typo, func(context.Context, int, *runtimeapi.PullImageRequest) error { return fakecri.NotFound(typo) })
	release := make(chan struct{})
	e.cri.SetBehavior(slow, func(ctx context.Context, _ int, _ *runtimeapi.PullImageRequest) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// The metrics server lives as long as the command's context.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	args := e.agentArgs("fetch", "--metrics-addr=127.0.0.1:0", "--initial-pull-attempt-timeout=10m", "typo:1", "ok:1", slow)
	done := make(chan int, 1)
	go func() { done <- Execute(ctx, args, e.deps()) }()
	addr := e.metricsAddr()

	var last map[string]float64
	var lastErr error
	during := map[string]float64{
		`image_prefetcher_pull_attempts_total{class="permanent"}`: 3,
		`image_prefetcher_pull_attempts_total{class="success"}`:   1,
		`image_prefetcher_pull_duration_seconds_count`:            1,
	}
	waitFor(t, "attempts of the finished images", func() bool {
		last, lastErr = scrape(addr)
		return lastErr == nil && has(last, during)
	})
	if _, ok := last[`image_prefetcher_images{state="present"}`]; ok {
		t.Errorf("images by state before the run finished: %v", last)
	}
	select {
	case code := <-done:
		t.Fatalf("fetch exited with %d while an image was still pulling", code)
	default:
	}

	close(release)
	if code := <-done; code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	after, err := scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		`image_prefetcher_images{state="present"}`:                2,
		`image_prefetcher_images{state="failed"}`:                 1,
		`image_prefetcher_pull_attempts_total{class="permanent"}`: 3,
		`image_prefetcher_pull_attempts_total{class="success"}`:   2,
		`image_prefetcher_pull_duration_seconds_count`:            2,
		`image_prefetcher_last_full_success_timestamp_seconds`:    0,
	}
	for k, v := range want {
		if after[k] != v {
			t.Errorf("%s = %v, want %v", k, after[k], v)
		}
	}
	if _, ok := after[`image_prefetcher_pull_attempts_total{class="transient"}`]; ok {
		t.Errorf("transient attempts counted: %v", after)
	}
}

// TestWatchServesMetrics scrapes watch's --metrics-addr while it runs, and
// checks that the server goes away with the process's context.
func TestWatchServesMetrics(t *testing.T) {
	e := newEnv(t)
	e.cri.AddImage("docker.io/library/present:1", 500)
	done := e.startWatch("--refresh-interval=5ms", "--metrics-addr=127.0.0.1:0", "present:1", "app:1")
	addr := e.metricsAddr()
	waitFor(t, "label succeeded", e.labelIs("succeeded"))

	got, err := scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		`image_prefetcher_images{state="present"}`:              2,
		`image_prefetcher_images{state="failed"}`:               0,
		`image_prefetcher_pull_attempts_total{class="success"}`: 1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if ts := got[`image_prefetcher_last_full_success_timestamp_seconds`]; ts <= 0 {
		t.Errorf("last full success %v", ts)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("/healthz: %s %q", resp.Status, body)
	}

	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
	waitFor(t, "the metrics server to stop", func() bool {
		_, err := scrape(addr)
		return err != nil
	})
}
