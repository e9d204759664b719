package cli

import (
	"context"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/kube/clientset"
	"github.com/image-prefetcher/image-prefetcher/agent/pin"
)

// A budget that is neither a share nor a quantity is a usage error that
// names the flag, before anything is pulled.
func TestPinBudgetUsage(t *testing.T) {
	for _, budget := range []string{"lots", "120%", "-1Gi"} {
		e := newEnv(t)
		if code := e.run("fetch", "--cri-socket="+e.cri.Socket, "--label-node=false", "--pin-budget="+budget, "x:1"); code != ExitUsage {
			t.Errorf("--pin-budget=%s: exit %d, want %d", budget, code, ExitUsage)
		}
		if got := e.logs.String(); !strings.Contains(got, "--pin-budget") {
			t.Errorf("--pin-budget=%s: the error does not name the flag:\n%s", budget, got)
		}
	}
}

// markStore is containerd's image records as agent/pin unpins them: list
// by label, get, set labels ("" removes one).
type markStore struct {
	mu   sync.Mutex
	recs map[string]pin.Record
}

func (s *markStore) List(_ context.Context, filter string) ([]pin.Record, error) {
	key := strings.TrimSuffix(strings.TrimPrefix(filter, `labels."`), `"`)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []pin.Record
	for _, r := range s.recs {
		if _, ok := r.Labels[key]; ok {
			r.Labels = maps.Clone(r.Labels)
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *markStore) Get(_ context.Context, name string) (pin.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[name]
	if !ok {
		return pin.Record{}, pin.ErrNotFound
	}
	r.Labels = maps.Clone(r.Labels)
	return r, nil
}

func (s *markStore) SetLabels(_ context.Context, r pin.Record, labels map[string]string) (pin.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.recs[r.Name]
	if !ok {
		return pin.Record{}, pin.ErrNotFound
	}
	for k, v := range labels {
		if v == "" {
			delete(cur.Labels, k)
		} else {
			cur.Labels[k] = v
		}
	}
	s.recs[r.Name] = cur
	cur.Labels = maps.Clone(cur.Labels)
	return cur, nil
}

func (s *markStore) Unpacked(context.Context, string) (uint64, error) { return 0, nil }

// With node labeling off (spec.nodeLabel.enabled: false renders
// --label-node=false), the pins still follow the instance on SIGTERM: they
// go when it no longer covers the node, and stay while it does, with the
// same list or a changed one (the next pod's check makes them follow it).
// Nothing else removes an uninstalled instance's pins.
func TestPinsGoWithTheInstanceWithoutALabel(t *testing.T) {
	const ns, podName = testNamespace, "image-prefetcher-demo-x7k2p"
	mark := pin.MarkKey(testNamespace, testInstance)
	tests := []struct {
		name       string
		ds         *appsv1.DaemonSet
		wantPinned bool
	}{
		{"DaemonSet deleted", nil, false},
		{"rollout keeping the list", daemonSet(ns, "image-prefetcher-demo", "app:1"), true},
		{"rollout changing the list", daemonSet(ns, "image-prefetcher-demo", "app:2"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			owner := tt.ds
			if tt.ds != nil {
				if _, err := e.kube.AppsV1().DaemonSets(ns).Create(context.Background(), tt.ds, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				owner = daemonSet(ns, "image-prefetcher-demo")
			}
			e.ownPod(ns, podName, owner)
			const name = "docker.io/library/app:1"
			store := &markStore{recs: map[string]pin.Record{name: {Name: name, Labels: map[string]string{
				pin.PinLabel: pin.PinValue, pin.SetByKey: pin.SetByValue, mark: "1",
			}}}}
			a := &agent{
				flags: &agentFlags{nodeName: testNode}, log: slog.New(slog.NewTextHandler(e.logs, nil)),
				kube: clientset.Wrap(e.kube), pod: podName, namespace: ns, digest: loadList("", []string{"app:1"}).Digest(),
				pinner: &pin.Pinner{Store: store, Namespace: testNamespace, Name: testInstance},
			}
			if err := a.settleKey(context.Background(), time.Now().Add(4*time.Second)); err != nil {
				t.Fatal(err)
			}
			labels := store.recs[name].Labels
			if pinned := labels[pin.PinLabel] != "" || labels[mark] != ""; pinned != tt.wantPinned {
				t.Errorf("record labels %v after SIGTERM: pinned or marked %v, want %v\n%s", labels, pinned, tt.wantPinned, e.logs)
			}
		})
	}
}
