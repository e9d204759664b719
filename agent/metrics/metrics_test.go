package metrics

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

func TestServe(t *testing.T) {
	m := New()
	m.Attempt(pull.Transient)
	m.Attempt(pull.Transient)
	m.Attempt("success")
	m.Pulled("a:1", 3*time.Second, 2048)
	m.Checked(4, 0, time.Unix(1700000000, 0))
	m.Unclassified()
	m.Unclassified()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := m.Serve(ctx, "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		return string(b)
	}
	if got := get("/healthz"); got != "ok\n" {
		t.Errorf("healthz %q", got)
	}
	body := get("/metrics")
	for _, want := range []string{
		`image_prefetcher_images{state="present"} 4`,
		`image_prefetcher_images{state="failed"} 0`,
		`image_prefetcher_pull_attempts_total{class="transient"} 2`,
		`image_prefetcher_pull_attempts_total{class="success"} 1`,
		`image_prefetcher_pulled_bytes_total 2048`,
		`image_prefetcher_pull_duration_seconds_count 1`,
		`image_prefetcher_last_full_success_timestamp_seconds 1.7e+09`,
		`image_prefetcher_unclassified_pull_errors_total 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %q in:\n%s", want, body)
		}
	}
	if _, err := m.Serve(ctx, "not-an-address", slog.Default()); err == nil {
		t.Error("bad address accepted")
	}
}
