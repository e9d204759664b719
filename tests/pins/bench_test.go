package pins_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

// BenchmarkTimeToLabel measures what pinning adds to the time to label a
// node for 10 images pulled from nothing: `fetch` runs against the node's
// containerd 2.x and the real kube-apiserver, with and without pinning, in
// random order within each iteration, so that both see the same machine.
// The time runs from the start of the process to the agent's "node
// labeled" log record. It reports the median of each, the overhead of
// pinning, and the whole run of fetch with pinning (which pins while it
// labels, and exits once the pins are set). The images
// are small (1 MiB), so that pulling, which pinning does not change, takes
// as little of the time as it can.
//
//	go test -p 1 ./tests/pins/ -run '^$' -bench TimeToLabel -benchtime 20x
func BenchmarkTimeToLabel(b *testing.B) {
	refs := make([]string, 10)
	for i := range refs {
		refs[i] = fmt.Sprintf("bench-%d", i)
	}
	refs = c.PushData(b, 1000, 1<<20, refs...)
	dir := b.TempDir()
	listFile := filepath.Join(dir, "images.txt")
	if err := os.WriteFile(listFile, []byte(strings.Join(refs, "\n")+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	n := c.Nodes()[0]
	cri, err := n.CRI()
	if err != nil {
		b.Fatal(err)
	}
	defer cri.Close()
	fetch := func(pin bool) (toLabel, toExit time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, r := range refs {
			if _, err := cri.Images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: r}}); err != nil {
				b.Fatal(err)
			}
		}
		var out bytes.Buffer
		cmd := c.Command(ctx, cluster.BinPath("image-prefetcher"), "fetch",
			"--kubeconfig="+c.Kubeconfig, "--cri-socket="+n.CRISocket, "--node-name="+n.Name,
			"--instance=bench", "--namespace=bench", "--image-list-file="+listFile,
			fmt.Sprintf("--pin=%v", pin), "--pin-budget=1Gi", "--log-format=json")
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("fetch: %v\n%s", err, out.String())
		}
		toExit = time.Since(start)
		// Until the label is written, by the agent's own clock: pinning
		// may go on after it.
		var labeled time.Time
		pinned := 0
		for _, l := range strings.Split(out.String(), "\n") {
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(l), &rec) != nil {
				continue
			}
			switch rec.Msg {
			case "node labeled":
				labeled = rec.Time
			case "pinned":
				pinned++
			}
		}
		if labeled.IsZero() {
			b.Fatalf("fetch did not label the node:\n%s", out.String())
		}
		if pin && pinned != len(refs) {
			b.Fatalf("fetch pinned %d images, want %d:\n%s", pinned, len(refs), out.String())
		}
		return labeled.Sub(start), toExit
	}
	var on, off, whole []time.Duration
	b.ResetTimer()
	pinned := func() {
		l, e := fetch(true)
		on, whole = append(on, l), append(whole, e)
	}
	unpinned := func() {
		l, _ := fetch(false)
		off = append(off, l)
	}
	for range b.N {
		if rand.IntN(2) == 0 {
			pinned()
			unpinned()
		} else {
			unpinned()
			pinned()
		}
	}
	b.StopTimer()
	mOn, mOff := median(on), median(off)
	b.ReportMetric(float64(mOn.Milliseconds()), "ms/label-pinning")
	b.ReportMetric(float64(mOff.Milliseconds()), "ms/label-no-pinning")
	b.ReportMetric(100*(float64(mOn)/float64(mOff)-1), "%overhead")
	b.ReportMetric(float64(median(whole).Milliseconds()), "ms/run-pinning")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
