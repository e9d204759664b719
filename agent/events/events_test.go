package events

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
)

func TestTruncate(t *testing.T) {
	// Each long case puts a multi-byte rune across byte maxMessage-3, where
	// a byte-wise cut would split it.
	straddle := func(r string) string {
		return strings.Repeat("a", maxMessage-4) + strings.Repeat(r, 10)
	}
	tests := []struct {
		name string
		in   string
		want string // exact result; empty: check the invariants only
	}{
		{name: "short", in: "2/3 images present", want: "2/3 images present"},
		{name: "exactly the limit", in: strings.Repeat("x", maxMessage), want: strings.Repeat("x", maxMessage)},
		{name: "ascii", in: strings.Repeat("x", maxMessage+1), want: strings.Repeat("x", maxMessage-3) + "..."},
		{name: "two-byte rune", in: straddle("é"), want: strings.Repeat("a", maxMessage-4) + "..."},
		{name: "three-byte rune", in: straddle("€"), want: strings.Repeat("a", maxMessage-4) + "..."},
		{name: "four-byte rune", in: straddle("😀"), want: strings.Repeat("a", maxMessage-4) + "..."},
		{name: "rune ending at the cut is kept", in: strings.Repeat("a", maxMessage-5) + strings.Repeat("é", 10), want: strings.Repeat("a", maxMessage-5) + "é..."},
		{name: "all multi-byte", in: strings.Repeat("ü", maxMessage)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := truncate(tt.in, maxMessage)
			if tt.want != "" && got != tt.want {
				t.Errorf("got %q (%d bytes), want %q (%d bytes)", got, len(got), tt.want, len(tt.want))
			}
			if len(got) > maxMessage {
				t.Errorf("%d bytes, limit %d", len(got), maxMessage)
			}
			if !utf8.ValidString(got) {
				t.Errorf("invalid UTF-8: %q", got[len(got)-8:])
			}
			if len(tt.in) > maxMessage {
				if !strings.HasSuffix(got, "...") || !strings.HasPrefix(tt.in, strings.TrimSuffix(got, "...")) {
					t.Errorf("not a prefix of the input plus an ellipsis: %q", got)
				}
				// At most one rune less than the byte limit allows.
				if len(got) < maxMessage-utf8.UTFMax {
					t.Errorf("cut too short: %d bytes", len(got))
				}
			}
		})
	}
}

func TestRecord(t *testing.T) {
	long := strings.Repeat("a", maxMessage-4) + strings.Repeat("€", 10)
	tests := []struct {
		name       string
		ok         bool
		message    string
		wantType   string
		wantReason string
		wantMsg    string
	}{
		{"success", true, "2/2 images present in 1.0s", corev1.EventTypeNormal, ReasonPrefetched, "2/2 images present in 1.0s"},
		{"failure", false, "1/2 images present in 1.0s; 1 failed: typo:1 (NotFound)", corev1.EventTypeWarning, ReasonPrefetchFailed, "1/2 images present in 1.0s; 1 failed: typo:1 (NotFound)"},
		{"long multi-byte message", false, long, corev1.EventTypeWarning, ReasonPrefetchFailed, strings.Repeat("a", maxMessage-4) + "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset()
			r := &Recorder{Client: clientset.Wrap(cs), Pod: "prefetch-abc", PodUID: "0b5d9f4e-1c2a-4f5e-9d3b-7a8c6e2f1d00", Namespace: "ns1", Component: "image-prefetcher", Host: "node-a"}
			r.Record(context.Background(), tt.ok, tt.message)
			evs, err := cs.CoreV1().Events("ns1").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != 1 {
				t.Fatalf("%d events, want 1", len(evs.Items))
			}
			ev := evs.Items[0]
			if ev.Type != tt.wantType || ev.Reason != tt.wantReason || ev.Message != tt.wantMsg {
				t.Errorf("type %q reason %q message %q", ev.Type, ev.Reason, ev.Message)
			}
			io := ev.InvolvedObject
			// kubectl describe pod lists only Events whose involvedObject.uid
			// is the pod's.
			if io.UID != "0b5d9f4e-1c2a-4f5e-9d3b-7a8c6e2f1d00" {
				t.Errorf("involvedObject.uid = %q, want the pod's UID", io.UID)
			}
			if io.Kind != "Pod" || io.Name != "prefetch-abc" || io.Namespace != "ns1" || ev.Source.Component != "image-prefetcher" || ev.Source.Host != "node-a" || ev.Count != 1 {
				t.Errorf("event %+v", ev)
			}
		})
	}
}

func TestRecordIsANoOpWithoutPod(t *testing.T) {
	cs := fake.NewClientset()
	tests := []struct {
		name   string
		client kube.Interface
		pod    string
		ns     string
	}{
		{"no pod name", clientset.Wrap(cs), "", "ns1"},
		{"no namespace", clientset.Wrap(cs), "prefetch-abc", ""},
		{"neither", clientset.Wrap(cs), "", ""},
		{"no API client", nil, "prefetch-abc", "ns1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			r := &Recorder{Client: tt.client, Pod: tt.pod, Namespace: tt.ns, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			r.Record(context.Background(), false, "1/2 images present")
			if n := len(cs.Actions()); n != 0 {
				t.Errorf("%d API calls, want none: %v", n, cs.Actions())
			}
			if !strings.Contains(logs.String(), "not recording an Event") {
				t.Errorf("no debug line about the skipped Event: %q", logs.String())
			}
		})
	}
}
