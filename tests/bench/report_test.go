package bench

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIdealAndRatio(t *testing.T) {
	tests := []struct {
		name      string
		bytes     int64
		bandwidth int64
		actual    time.Duration
		wantIdeal time.Duration
		wantRatio float64
	}{
		{"exact", 100 * MiB, 50 * MiB, 2 * time.Second, 2 * time.Second, 1},
		{"slower than ideal", 300 * MiB, 100 * MiB, 4500 * time.Millisecond, 3 * time.Second, 1.5},
		{"no cap has no ideal", 100 * MiB, 0, time.Second, 0, math.NaN()},
		{"nothing served", 0, 50 * MiB, time.Second, 0, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ideal := Ideal(tt.bytes, tt.bandwidth)
			if ideal != tt.wantIdeal {
				t.Errorf("Ideal(%d, %d) = %v, want %v", tt.bytes, tt.bandwidth, ideal, tt.wantIdeal)
			}
			got := Ratio(tt.actual, ideal)
			if math.IsNaN(tt.wantRatio) != math.IsNaN(got) || !math.IsNaN(got) && math.Abs(got-tt.wantRatio) > 1e-9 {
				t.Errorf("Ratio(%v, %v) = %v, want %v", tt.actual, ideal, got, tt.wantRatio)
			}
		})
	}
}

func TestLayerSizes(t *testing.T) {
	tests := []struct {
		total int64
		n     int
		want  []int64
	}{
		{60, 3, []int64{30, 20, 10}},
		{10, 1, []int64{10}},
		{11, 2, []int64{8, 3}}, // the remainder goes to the base layer
	}
	for _, tt := range tests {
		got := LayerSizes(tt.total, tt.n)
		if len(got) != len(tt.want) {
			t.Fatalf("LayerSizes(%d, %d) = %v, want %v", tt.total, tt.n, got, tt.want)
		}
		var sum int64
		for i := range got {
			sum += got[i]
			if got[i] != tt.want[i] {
				t.Errorf("LayerSizes(%d, %d) = %v, want %v", tt.total, tt.n, got, tt.want)
				break
			}
		}
		if sum != tt.total {
			t.Errorf("LayerSizes(%d, %d) sums to %d", tt.total, tt.n, sum)
		}
	}
}

func TestParseConfigs(t *testing.T) {
	tests := []struct {
		in      string
		want    []Config
		wantErr bool
	}{
		{in: "nocap,k2,k5,seed1", want: []Config{
			{Name: "nocap"}, {Name: "k2", MaxConcurrentNodes: 2}, {Name: "k5", MaxConcurrentNodes: 5},
			{Name: "seed1", MaxConcurrentNodes: 5, SeedNodes: 1},
		}},
		{in: "seed2k3", want: []Config{{Name: "seed2k3", MaxConcurrentNodes: 3, SeedNodes: 2}}},
		{in: "k0", wantErr: true},
		{in: "kx", wantErr: true},
		{in: "fast", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseConfigs(tt.in)
		if (err != nil) != tt.wantErr {
			t.Fatalf("ParseConfigs(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
		}
		if tt.wantErr {
			continue
		}
		if len(got) != len(tt.want) {
			t.Fatalf("ParseConfigs(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("ParseConfigs(%q)[%d] = %+v, want %+v", tt.in, i, got[i], tt.want[i])
			}
		}
	}
}

func sampleReport() Report {
	s := func(v ...float64) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x*float64(time.Second)))
		}
		return out
	}
	return Report{
		Machine:  "2 CPU cores",
		Versions: "Kubernetes v1.36.3, containerd 1.6.20",
		Nodes:    3,
		Images: []Image{
			{Ref: "ghcr.io/bench/app-01@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Layers: 2, Bytes: 10 * MiB},
			{Ref: "ghcr.io/bench/app-02@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210", Layers: 3, Bytes: 20 * MiB},
		},
		Bandwidth:              30 * MiB,
		Latency:                10 * time.Millisecond,
		Parallelism:            4,
		MaxConcurrentDownloads: 1,
		SingleNode:             60 * MiB,
		UsefulConcurrency:      1,
		Capacity:               Capacity{ContainerdPeakRSS: 50 * MiB, AgentPeakRSS: 50 * MiB, DiskPerNode: 60 * MiB, MemAvailable: 1000 * MiB, DiskFree: 600 * MiB},
		Runs: []Run{
			{Config: Config{Name: "nocap"}, Completions: s(3.0, 3.1, 3.2), PeakConns: 30, PeakBlobTransfers: 12, Requests: 21, Bytes: 90 * MiB, CPUBusy: 0.5},
			{Config: Config{Name: "nocap"}, Second: true, Completions: s(0.1, 0.1, 0.2)},
			// 4.5 s for 90 MiB at 30 MiB/s: 1.5 × the ideal, and 5 blobs
			// at once with K=1 and 4 per node.
			// 99 MiB served for 90 needed: attempts cut and restarted.
			{Config: Config{Name: "k1", MaxConcurrentNodes: 1}, Completions: s(1.5, 3.0, 4.5), PeakConns: 4, PeakBlobTransfers: 5, Requests: 21, Bytes: 99 * MiB, PeakSlotHolders: 1},
			{Config: Config{Name: "k1", MaxConcurrentNodes: 1}, Second: true, Completions: s(0.1, 0.1), Failed: 1, Requests: 2},
		},
		PlotFile: "benchmarks-completion.png",
	}
}

func TestChecks(t *testing.T) {
	want := []Check{
		{"no cap", "served ≤ 1.02 × needed", "1.00 ×", true},
		{"no cap", "last node ≤ 1.2 × ideal", "1.07 ×", true},
		{"no cap, 2nd run", "0 registry requests", "0 requests", true},
		{"K=1", "peak blob transfers ≤ K × 4 = 4", "5", false},
		{"K=1", "served ≤ 1.02 × needed", "1.10 ×", false},
		{"K=1", "last node ≤ 1.3 × ideal", "1.50 ×", false},
		{"K=1, 2nd run", "0 registry requests", "2 requests", false},
		{"K=1, 2nd run", "every node labeled succeeded", "1 not", false},
	}
	got := sampleReport().Checks()
	if len(got) != len(want) {
		t.Fatalf("Checks() = %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("check %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestBlobBound(t *testing.T) {
	r := Report{Nodes: 10, Parallelism: 4, MaxConcurrentDownloads: 3}
	tests := []struct {
		cfg  Config
		want int
	}{
		{Config{}, 120},                       // every node
		{Config{MaxConcurrentNodes: 2}, 24},   // K × 4 × 3
		{Config{MaxConcurrentNodes: 50}, 120}, // K above the node count
		{Config{MaxConcurrentNodes: 5, SeedNodes: 1}, 60},
	}
	for _, tt := range tests {
		if got := r.BlobBound(tt.cfg); got != tt.want {
			t.Errorf("BlobBound(%+v) = %d, want %d", tt.cfg, got, tt.want)
		}
	}
}

func TestMarkdownTable(t *testing.T) {
	md := sampleReport().Markdown()
	for _, line := range []string{
		"| configuration | run | all labeled | ideal | ratio | first labeled | peak conns | peak blobs | bound | slots | requests | served | CPU |",
		"| no cap | 1st (empty nodes) | 3.2 s | 3.0 s | 1.07 | 3.0 s | 30 | 12 | 12 | 0 | 21 | 90.0 MiB (1.00×) | 50% |",
		"| no cap | 2nd (all present) | 0.2 s | – | – | 0.1 s | 0 | 0 | 12 | 0 | 0 | 0 B | 0% |",
		"| K=1 | 1st (empty nodes) | 4.5 s | 3.0 s | 1.50 | 1.5 s | 4 | 5 | 4 | 1 | 21 | 99.0 MiB (1.10×) | 0% |",
		"| K=1 | served ≤ 1.02 × needed | 1.10 × | **no** |",
		"| no cap | last node ≤ 1.2 × ideal | 1.07 × | yes |",
		"| K=1 | 2nd (all present) | 0.1 s | – | – | 0.1 s | 0 | 0 | 4 | 0 | 2 | 0 B | 0% |",
		"  | `ghcr.io/bench/app-01@sha256:0123456789ab…` | 2 | 10.0 MiB |",
		"| K=1 | peak blob transfers ≤ K × 4 = 4 | 5 | **no** |",
		"| K=1, 2nd run | every node labeled succeeded | 1 not | **no** |",
		"![Nodes labeled over time, per configuration](benchmarks-completion.png)",
		"enough for about 10 nodes by memory and 10 by disk",
	} {
		if !strings.Contains(md, line+"\n") && !strings.Contains(md, line) {
			t.Errorf("report lacks line %q\n%s", line, md)
		}
	}
	// Every table row has as many cells as its header.
	var header int
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			header = 0
			continue
		}
		cells := strings.Count(strings.TrimSpace(line), "|")
		if header == 0 {
			header = cells
		} else if cells != header {
			t.Errorf("row %q has %d separators, header %d", line, cells, header)
		}
	}
}

func TestCompletionSteps(t *testing.T) {
	got := CompletionSteps([]float64{1, 2.5})
	want := [][2]float64{{0, 0}, {1, 0}, {1, 1}, {2.5, 1}, {2.5, 2}}
	if len(got) != len(want) {
		t.Fatalf("CompletionSteps = %v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].X != w[0] || got[i].Y != w[1] {
			t.Errorf("point %d = %v, want %v", i, got[i], w)
		}
	}
}

func TestWritePlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plot.png")
	if err := sampleReport().WritePlot(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("plot is not a PNG: %v", err)
	}
	if cfg.Width < 800 || cfg.Height < 400 {
		t.Errorf("plot is %dx%d, too small to read", cfg.Width, cfg.Height)
	}
}
