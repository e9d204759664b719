package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/registry"
)

// Scenario 20: spec.metrics enabled. While the fetch init container is
// still pulling (the registry stalls one image), the pod's metrics port
// already answers with fetch's metrics, not yet succeeded: the PodMonitor's
// target covers the first pull. Then the kubelet's liveness and readiness
// probes on /healthz pass (every pod Ready, no restart), and /metrics on the
// pod's named port, scraped from inside the cluster's network namespace as
// Prometheus would, returns the agent's metrics with every image present.
func Test20MetricsEndpoint(t *testing.T) {
	e := setup(t)
	refs := testImages(t, 2000, 64<<10, "metrics-a", "metrics-b")
	reg := c.Registry()
	reg.Stall(registry.Match{Repo: "e2e/metrics-b"}, len(c.Nodes()), 0)
	t.Cleanup(reg.ClearFaults)
	spec := yamlList(refs) + "  pull:\n    initialAttemptTimeout: 5m\n  metrics:\n    enabled: true\n"
	d := e.deployInstance(t, instance{Name: "metrics", Namespace: "e2e-metrics", Spec: spec})

	ctx, cancel := context.WithTimeout(context.Background(), labelWait+2*time.Minute)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DialContext: c.NetNS.DialContext}, Timeout: 10 * time.Second}
	list := func() []corev1.Pod {
		t.Helper()
		pods, err := e.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + d.Name})
		if err != nil {
			t.Fatal(err)
		}
		return pods.Items
	}
	scraped := map[string]bool{}
	if err := poll(ctx, "fetch's metrics on every pod while it pulls", func() (bool, string) {
		for _, p := range list() {
			if scraped[p.Name] || p.Status.PodIP == "" {
				continue
			}
			body, err := tryGet(ctx, client, "http://"+net.JoinHostPort(p.Status.PodIP, "9100")+"/metrics")
			if err != nil || !strings.Contains(body, "\nimage_prefetcher_succeeded 0\n") {
				continue
			}
			if st := p.Status.InitContainerStatuses; len(st) != 1 || st[0].State.Running == nil {
				return false, fmt.Sprintf("pod %s answered, but fetch is not running: %+v", p.Name, st)
			}
			scraped[p.Name] = true
			logf(t, "pod %s on %s serves fetch's metrics during the first pull", p.Name, p.Spec.NodeName)
		}
		return len(scraped) == len(c.Nodes()), fmt.Sprintf("scraped %v", scraped)
	}); err != nil {
		e.dumpPods(t, d.Namespace)
		t.Fatal(err)
	}
	reg.ClearFaults()

	for _, n := range c.Nodes() {
		e.waitLabel(t, d, n.Name, "succeeded", labelWait)
	}
	e.waitRolledOut(t, d, len(c.Nodes()))
	pods := list()
	if len(pods) != len(c.Nodes()) {
		t.Fatalf("%d pods, want %d", len(pods), len(c.Nodes()))
	}
	for _, p := range pods {
		if !metricsPodReady(&p) {
			t.Errorf("pod %s on %s is not Ready: %+v", p.Name, p.Spec.NodeName, p.Status.Conditions)
		}
		watch := p.Spec.Containers[0]
		if watch.ReadinessProbe == nil || watch.LivenessProbe == nil || len(watch.Ports) != 1 || watch.Ports[0].Name != "metrics" {
			t.Fatalf("pod %s: watch container without the metrics port and probes: %+v", p.Name, watch)
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.RestartCount != 0 {
				t.Errorf("pod %s container %s restarted %d times: a probe failed", p.Name, st.Name, st.RestartCount)
			}
		}
		url := "http://" + net.JoinHostPort(p.Status.PodIP, fmt.Sprint(watch.Ports[0].ContainerPort)) + "/metrics"
		body := getInNetNS(t, ctx, client, url)
		for _, want := range []string{
			`image_prefetcher_succeeded 1`,
			`image_prefetcher_images{state="present"} 2`,
			`image_prefetcher_images{state="failed"} 0`,
			`image_prefetcher_label_conflicts_total 0`,
		} {
			if !strings.Contains(body, "\n"+want+"\n") {
				t.Errorf("%s (pod %s on %s) lacks %q:\n%s", url, p.Name, p.Spec.NodeName, want, body)
			}
		}
		if h := getInNetNS(t, ctx, client, strings.TrimSuffix(url, "/metrics")+"/healthz"); h != "ok\n" {
			t.Errorf("/healthz of pod %s: %q", p.Name, h)
		}
		logf(t, "scraped %s (pod %s on %s): %d bytes", url, p.Name, p.Spec.NodeName, len(body))
	}
}

func metricsPodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func tryGet(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

func getInNetNS(t *testing.T, ctx context.Context, client *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s from the cluster's network namespace: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}
