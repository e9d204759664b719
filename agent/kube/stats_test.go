package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

func TestKubeletStats(t *testing.T) {
	const summary = `{"node":{"nodeName":"n1","runtime":{"imageFs":{"capacityBytes":1000,"availableBytes":400,"usedBytes":300}}}}`
	other := otherCA(t)
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		otherCA bool
		// hang: the kubelet never answers within the client's timeout.
		hang     bool
		insecure bool
		want     ImageFs
		wantErr  string
		// wantNone: asking again will not mend it (ErrNoKubeletStats).
		wantNone bool
		wantHits int32
	}{
		{name: "figures from a verified kubelet", status: 200, body: summary, want: ImageFs{CapacityBytes: 1000, AvailableBytes: 400, UsedBytes: 300}, wantHits: 1},
		{name: "forbidden says the permission", status: 403, body: "Forbidden", wantErr: "nodes/stats", wantNone: true, wantHits: 1},
		{name: "500 after the node boots: asked again", status: 500, body: "not ready", wantErr: "500", wantHits: 1},
		{name: "a port that drops packets: no source", status: 200, body: summary, hang: true, wantErr: "egress", wantNone: true, wantHits: 1},
		{name: "no imageFs", status: 200, body: `{"node":{"runtime":{}}}`, wantErr: "no image filesystem capacity", wantNone: true, wantHits: 1},
		{name: "certificate not signed by the CA: no request, no token", status: 200, body: summary, otherCA: true, wantErr: "certificate", wantNone: true, wantHits: 0},
		{name: "insecure configuration refused", insecure: true, wantErr: "unverified", wantNone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				if r.URL.Path != "/stats/summary" || r.Header.Get("Authorization") != "Bearer tok" {
					t.Errorf("request %s with Authorization %q", r.URL.Path, r.Header.Get("Authorization"))
				}
				if tc.hang {
					<-r.Context().Done()
					return
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			ca := srv.Certificate()
			if tc.otherCA {
				ca = other
			}
			host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
			p, _ := strconv.Atoi(port)
			node := &corev1.Node{}
			node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: host}}
			node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
			cfg := &rest.Config{Host: "https://apiserver.invalid", BearerToken: "tok",
				TLSClientConfig: rest.TLSClientConfig{ServerName: "kubernetes.default.svc", CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})}}
			if tc.insecure {
				cfg.TLSClientConfig = rest.TLSClientConfig{Insecure: true}
			}
			k, err := NewKubeletStats(cfg, node)
			var got ImageFs
			if err == nil && tc.hang {
				// Long enough for the TLS handshake on a loaded machine:
				// at 100 ms, make test's unit phase once sent no request.
				k.client.Timeout = time.Second
			}
			if err == nil {
				got, err = k.Read(context.Background())
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one with %q", err, tc.wantErr)
				}
			} else if err != nil || got != tc.want {
				t.Fatalf("ImageFs = %+v, %v; want %+v", got, err, tc.want)
			}
			if errors.Is(err, ErrNoKubeletStats) != tc.wantNone {
				t.Errorf("errors.Is(%v, ErrNoKubeletStats) = %v, want %v", err, !tc.wantNone, tc.wantNone)
			}
			if h := hits.Load(); h != tc.wantHits {
				t.Fatalf("the kubelet got %d requests, want %d", h, tc.wantHits)
			}
		})
	}
}

// otherCA is a CA that signed nothing the test server serves.
func otherCA(t *testing.T) *x509.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
