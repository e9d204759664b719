package cluster

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// Options.KubeletAuth: the node's serving certificate verifies against the
// cluster CA for the node's IP, with the agent's own client code, and the
// kubelet configuration turns webhook authentication and authorization on.
func TestKubeletAuthServingCertificate(t *testing.T) {
	dir := t.TempDir()
	p, err := writePKI(dir, []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: dir, pki: p, opts: Options{KubeletAuth: true}}
	n := &Node{c: c, Name: "node-1", IP: "127.0.0.1", Dir: t.TempDir()}
	fields, err := n.kubeletAuth()
	if err != nil {
		t.Fatal(err)
	}
	if authz, _ := fields["authorization"].(map[string]any); authz["mode"] != "Webhook" {
		t.Errorf("authorization %v, want Webhook", fields["authorization"])
	}
	cert, err := tls.LoadX509KeyPair(fields["tlsCertFile"].(string), fields["tlsPrivateKeyFile"].(string))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer agent-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"node":{"runtime":{"imageFs":{"capacityBytes":100,"availableBytes":60,"usedBytes":10}}}}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	pn, _ := strconv.Atoi(port)
	node := &corev1.Node{}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(pn)
	k, err := kube.NewKubeletStats(&rest.Config{BearerToken: "agent-token", TLSClientConfig: rest.TLSClientConfig{CAData: p.CAPEM}}, node)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := k.Read(context.Background())
	if err != nil || fs.CapacityBytes != 100 || fs.AvailableBytes != 60 {
		t.Fatalf("Read = %+v, %v", fs, err)
	}
}
