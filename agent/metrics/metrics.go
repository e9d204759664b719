// Package metrics exposes the agent's Prometheus metrics and health check.
// Nothing is served unless --metrics-addr is set.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// Metrics holds the agent's collectors on a private registry. It
// implements pull.Observer.
type Metrics struct {
	Registry     *prometheus.Registry
	Images       *prometheus.GaugeVec
	PullDuration prometheus.Histogram
	PullBytes    prometheus.Counter
	Attempts     *prometheus.CounterVec
	LastSuccess  prometheus.Gauge
	// OwnerConflict is 1 while the node key belongs to another instance of
	// the same name (see agent/label's Owner).
	OwnerConflict prometheus.Gauge
	// Succeeded, ImageFailed, SlotWaiting, SlotWait and LabelConflicts are
	// what the PrometheusRule's alerts and the Grafana dashboard read
	// (docs/monitoring.md).
	Succeeded      prometheus.Gauge
	ImageFailed    *prometheus.GaugeVec
	SlotWaiting    prometheus.Gauge
	SlotWait       prometheus.Histogram
	LabelConflicts prometheus.Counter
	// StartupTaintRemovals counts startup-taint removals by reason:
	// StartupTaintRemoved (images present) or StartupTaintTimeout
	// (fail-open at maxWait).
	StartupTaintRemovals *prometheus.CounterVec
	// UnclassifiedErrors counts pull errors the classifier did not
	// recognise (retried as transient; the log has each text once).
	UnclassifiedErrors prometheus.Counter
	// PinUnsupported is 1 while the runtime cannot pin images (agent/pin).
	PinUnsupported prometheus.Gauge
	// HeldByGC is the images whose re-download is held back because the
	// node's image GC keeps removing them (agent/gcguard).
	HeldByGC prometheus.Gauge
}

// New registers the collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Images: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_prefetcher_images", Help: "Images of the list by state (present, failed).",
		}, []string{"state"}),
		PullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "image_prefetcher_pull_duration_seconds", Help: "Duration of successful pulls, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 12),
		}),
		PullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "image_prefetcher_pulled_bytes_total", Help: "Size of pulled images as reported by the runtime.",
		}),
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_prefetcher_pull_attempts_total", Help: "Pull attempts by outcome: success, transient or permanent error.",
		}, []string{"class"}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "image_prefetcher_last_full_success_timestamp_seconds", Help: "Unix time of the last check that found every image present.",
		}),
		OwnerConflict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "image_prefetcher_owner_conflict", Help: "1 while this instance's node key belongs to another instance of the same name in another namespace, or to another copy (DaemonSet) of this one, which this one leaves alone; 0 once it wrote the key.",
		}),
	}
	m.StartupTaintRemovals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "image_prefetcher_startup_taint_removals_total", Help: "Startup taints removed from the node, by reason: StartupTaintRemoved (every image present) or StartupTaintTimeout (maxWait passed with images missing).",
	}, []string{"reason"})
	m.UnclassifiedErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "image_prefetcher_unclassified_pull_errors_total", Help: "Pull errors no classifier rule recognised; retried as transient and logged once each as unclassified.",
	})
	m.PinUnsupported = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "image_prefetcher_pin_unsupported", Help: "1 when this node's runtime cannot pin images (containerd before 1.6.25 and 1.7.10, CRI-O), so that the kubelet's image garbage collection may remove prefetched images; 0 otherwise, and with pinning off.",
	})
	m.Succeeded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "image_prefetcher_succeeded", Help: "1 when the last check found every image of the list present (the node label's succeeded), 0 otherwise and until the first check ends.",
	})
	m.ImageFailed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "image_prefetcher_image_failed", Help: "1 for each image the last check could not make present, by reason; like the node annotation, at most the first 20.",
	}, []string{"image", "reason"})
	m.SlotWaiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "image_prefetcher_slot_waiting", Help: "1 while the agent waits for a herd-control pull slot (spec.pull.maxConcurrentNodes), 0 otherwise.",
	})
	m.SlotWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "image_prefetcher_slot_wait_seconds", Help: "Time spent waiting for a herd-control pull slot, per acquisition.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 13),
	})
	m.LabelConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "image_prefetcher_label_conflicts_total", Help: "Times this instance's node label or annotation was found changed by another writer since the agent wrote it.",
	})
	m.HeldByGC = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "image_prefetcher_gc_held_images", Help: "Images the node's image GC removed again after the agent pulled them back, whose re-download is held back (1 h, doubling at each further removal).",
	})
	m.Registry.MustRegister(m.HeldByGC, m.Images, m.PullDuration, m.PullBytes, m.Attempts, m.LastSuccess,
		m.Succeeded, m.ImageFailed, m.SlotWaiting, m.SlotWait, m.LabelConflicts, m.StartupTaintRemovals, m.OwnerConflict, m.UnclassifiedErrors, m.PinUnsupported)
	return m
}

// Failure is one image that a check could not make present.
type Failure struct{ Image, Reason string }

// Failed replaces the per-image failures with those of the last check.
func (m *Metrics) Failed(fs []Failure) {
	m.ImageFailed.Reset()
	for _, f := range fs {
		m.ImageFailed.WithLabelValues(f.Image, f.Reason).Set(1)
	}
}

// LabelConflict counts one change of the node key by another writer.
func (m *Metrics) LabelConflict() { m.LabelConflicts.Inc() }

// Gate measures the waits for a herd-control slot of g. The slot it
// returns is g's own: its loss, its release and the release's grace are
// those of g.
func (m *Metrics) Gate(g pull.Gate) pull.Gate { return waitGate{g: g, m: m} }

type waitGate struct {
	g pull.Gate
	m *Metrics
}

func (w waitGate) Hold(ctx context.Context) (pull.Slot, error) {
	start := time.Now()
	w.m.SlotWaiting.Set(1)
	s, err := w.g.Hold(ctx)
	w.m.SlotWaiting.Set(0)
	if err == nil {
		w.m.SlotWait.Observe(time.Since(start).Seconds())
	}
	return s, err
}

// Attempt counts one pull attempt.
func (m *Metrics) Attempt(c pull.Class) { m.Attempts.WithLabelValues(string(c)).Inc() }

// Unclassified counts one pull error no classifier rule recognised.
func (m *Metrics) Unclassified() { m.UnclassifiedErrors.Inc() }

// Pulled records one successful pull.
func (m *Metrics) Pulled(_ string, d time.Duration, bytes uint64) {
	m.PullDuration.Observe(d.Seconds())
	m.PullBytes.Add(float64(bytes))
}

// Checked records the outcome of a full check.
func (m *Metrics) Checked(present, failed int, at time.Time) {
	m.Images.WithLabelValues("present").Set(float64(present))
	m.Images.WithLabelValues("failed").Set(float64(failed))
	m.Succeeded.Set(0)
	if failed == 0 {
		m.LastSuccess.Set(float64(at.Unix()))
		m.Succeeded.Set(1)
	}
}

// StartupTaintRemoved counts one startup-taint removal.
func (m *Metrics) StartupTaintRemoved(reason string) {
	m.StartupTaintRemovals.WithLabelValues(reason).Inc()
}

// Serve serves /metrics and /healthz on addr until ctx ends. It returns
// the bound address once listening, so a bad address fails the command at
// once.
func (m *Metrics) Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return ln.Addr(), nil
}
