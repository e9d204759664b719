package kube

import (
	"context"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The DaemonSet GET reaches the apps/v1 path and decodes what watch needs;
// a 404 is recognised as NotFound.
func TestDaemonSetGet(t *testing.T) {
	s, cfg := newServer(t)
	c, err := NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.body = `{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"image-prefetcher-demo","namespace":"ns","deletionTimestamp":"2026-11-24T00:00:00Z"},` +
		`"spec":{"template":{"spec":{"nodeSelector":{"pool":"gpu"},"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}}}}},` +
		`"status":{"desiredNumberScheduled":1000}}`
	ds, err := c.DaemonSets("ns").Get(context.Background(), "image-prefetcher-demo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// JSON only: the agent decodes the DaemonSet by hand, and the real
	// apiserver would answer an Accept that lists protobuf first in it.
	if got := s.last(t); got.Method != http.MethodGet || got.Path != "/apis/apps/v1/namespaces/ns/daemonsets/image-prefetcher-demo" ||
		got.Accept != "application/json" {
		t.Errorf("request %+v", got)
	}
	spec := ds.Spec.Template.Spec
	if ds.Name != "image-prefetcher-demo" || ds.DeletionTimestamp == nil || spec.NodeSelector["pool"] != "gpu" ||
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "zone" {
		t.Errorf("decoded %+v", ds)
	}
	s.status, s.body = http.StatusNotFound, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"details":{"name":"x","group":"apps","kind":"daemonsets"}}`
	if _, err := c.DaemonSets("ns").Get(context.Background(), "x", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("err %v, want NotFound", err)
	}
}

// The DaemonSet list sends the label selector, JSON only, and decodes the
// volumes status --hits reads.
func TestDaemonSetList(t *testing.T) {
	s, cfg := newServer(t)
	c, err := NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.body = `{"apiVersion":"apps/v1","kind":"DaemonSetList","metadata":{},"items":[{"metadata":{"name":"image-prefetcher-web"},` +
		`"spec":{"template":{"spec":{"volumes":[{"name":"image-list","configMap":{"name":"image-prefetcher-web.images-7h2k"}}]}}}}]}`
	l, err := c.DaemonSets("ns").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=web"})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.last(t); got.Method != http.MethodGet || got.Path != "/apis/apps/v1/namespaces/ns/daemonsets" ||
		got.Query != "labelSelector=app.kubernetes.io%2Finstance%3Dweb" || got.Accept != "application/json" {
		t.Errorf("request %+v", got)
	}
	if len(l.Items) != 1 || l.Items[0].Name != "image-prefetcher-web" || l.Items[0].Spec.Template.Spec.Volumes[0].ConfigMap.Name != "image-prefetcher-web.images-7h2k" {
		t.Errorf("decoded %+v", l)
	}
}

// The pod GET asks for the metadata only, and decodes the owner
// references the agent follows to its DaemonSet.
func TestPodGetMetadata(t *testing.T) {
	s, cfg := newServer(t)
	c, err := NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.body = `{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"p-x7k2p","namespace":"ns","uid":"u1",` +
		`"ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"ds","uid":"u2","controller":true}]}}`
	m, err := c.Pods("ns").GetMetadata(context.Background(), "p-x7k2p")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.last(t); got.Method != http.MethodGet || got.Path != "/api/v1/namespaces/ns/pods/p-x7k2p" ||
		got.Accept != "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1" {
		t.Errorf("request %+v", got)
	}
	if m.Name != "p-x7k2p" || len(m.OwnerReferences) != 1 || m.OwnerReferences[0].Name != "ds" || m.OwnerReferences[0].Controller == nil || !*m.OwnerReferences[0].Controller {
		t.Errorf("decoded %+v", m)
	}
	s.status, s.body = http.StatusNotFound, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"details":{"name":"x","kind":"pods"}}`
	if _, err := c.Pods("ns").GetMetadata(context.Background(), "x"); !apierrors.IsNotFound(err) {
		t.Errorf("err %v, want NotFound", err)
	}
}
