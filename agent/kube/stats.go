package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

// ImageFs is the image filesystem as the kubelet's stats summary reports
// it (node.runtime.imageFs): the figures its image GC and eviction go by.
type ImageFs struct {
	CapacityBytes  uint64 `json:"capacityBytes"`
	AvailableBytes uint64 `json:"availableBytes"`
	UsedBytes      uint64 `json:"usedBytes"`
	// ReadAt is when the agent read them (NodeFigures), not in the summary.
	ReadAt time.Time `json:"-"`
}

// ErrNoKubeletStats is wrapped by the errors that asking again will not
// mend by itself: a serving certificate the agent cannot verify, a
// configuration that would not verify it, a kubelet that refuses the
// agent's token (401, 403), a port that drops packets, a summary without
// the image filesystem. The figures are then asked again with backoff, but
// pulls do not wait for them.
var ErrNoKubeletStats = errors.New("no kubelet stats for the agent")

// KubeletStats reads the image filesystem from the node's own kubelet,
// GET https://<node address>:<kubelet port>/stats/summary. The kubelet
// authorizes that path as get on the nodes/stats subresource
// (pkg/kubelet/server/auth.go), read-only; the API server's
// nodes/<name>/proxy would need nodes/proxy, which reaches exec.
//
// The connection is verified against the client's CA (the cluster CA in a
// pod), so the token goes only to a kubelet whose serving certificate the
// cluster signed for that address. A self-signed kubelet certificate
// fails the handshake before any request, and so before the token, is
// sent.
type KubeletStats struct {
	client *http.Client
	url    string
}

// NewKubeletStats builds a reader for the kubelet of node, reached at its
// InternalIP and the port the node reports. cfg is the agent's API client
// configuration: its credentials and CA are reused, its server name not.
func NewKubeletStats(cfg *rest.Config, node *corev1.Node) (*KubeletStats, error) {
	addr := nodeAddress(node)
	if addr == "" {
		return nil, fmt.Errorf("node %s reports no InternalIP", node.Name)
	}
	port := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	if port == 0 {
		port = 10250
	}
	if cfg.Insecure {
		return nil, fmt.Errorf("%w: the client configuration skips TLS verification: "+
			"the token is not sent to the kubelet unverified", ErrNoKubeletStats)
	}
	c := rest.CopyConfig(cfg)
	c.Host = "https://" + net.JoinHostPort(addr, strconv.Itoa(port))
	c.APIPath = ""
	c.TLSClientConfig.ServerName = ""
	// The API server's own rate limit and QPS settings do not apply to the
	// kubelet; NodeFigures bounds the calls.
	c.RateLimiter = nil
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubelet HTTP client: %w", err)
	}
	hc.Timeout = 10 * time.Second
	return &KubeletStats{client: hc, url: c.Host + "/stats/summary"}, nil
}

// nodeAddress is the node's first InternalIP: the address the kubelet's
// serving certificate names and the API server uses by default.
func nodeAddress(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// Read makes one call to the kubelet and returns its figures.
func (k *KubeletStats) Read(ctx context.Context) (ImageFs, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return ImageFs{}, err
	}
	resp, err := k.client.Do(req)
	if err != nil {
		var nerr net.Error
		switch {
		case unverified(err):
			err = fmt.Errorf("%w: %w", ErrNoKubeletStats, err)
		case errors.As(err, &nerr) && nerr.Timeout() && ctx.Err() == nil:
			// Packets dropped: a default-deny egress policy or a host
			// firewall, not a kubelet starting (it refuses, or answers 500).
			err = fmt.Errorf("%w: no answer from the kubelet's port (the agent needs egress to it): %w",
				ErrNoKubeletStats, err)
		}
		return ImageFs{}, fmt.Errorf("kubelet stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		err := fmt.Errorf("kubelet stats: %s: %s (the agent needs get on nodes/stats)", resp.Status, body)
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			err = fmt.Errorf("%w: %w", ErrNoKubeletStats, err)
		}
		return ImageFs{}, err
	}
	var s struct {
		Node struct {
			Runtime struct {
				ImageFs *ImageFs `json:"imageFs"`
			} `json:"runtime"`
		} `json:"node"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&s); err != nil {
		return ImageFs{}, fmt.Errorf("kubelet stats: decode: %w", err)
	}
	fs := s.Node.Runtime.ImageFs
	if fs == nil || fs.CapacityBytes == 0 {
		return ImageFs{}, fmt.Errorf("kubelet stats: %w: no image filesystem capacity in the summary", ErrNoKubeletStats)
	}
	return *fs, nil
}

// unverified holds for a handshake that failed on the kubelet's
// certificate: no request, and so no token, was sent.
func unverified(err error) bool {
	var verr *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verr) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid)
}
