package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// ImageFs is the image filesystem as the kubelet's stats summary reports
// it (node.runtime.imageFs): the figures its image GC and eviction go by.
type ImageFs struct {
	CapacityBytes  uint64 `json:"capacityBytes"`
	AvailableBytes uint64 `json:"availableBytes"`
	UsedBytes      uint64 `json:"usedBytes"`
}

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
	// MaxAge is how long a reading is reused: the kubelet refreshes its
	// figures every few seconds, and the disk guard looks far more often.
	MaxAge time.Duration

	mu   sync.Mutex
	last ImageFs
	at   time.Time
	err  error
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
		return nil, errors.New("the client configuration skips TLS verification: the token is not sent to the kubelet unverified")
	}
	c := rest.CopyConfig(cfg)
	c.Host = "https://" + net.JoinHostPort(addr, strconv.Itoa(port))
	c.APIPath = ""
	c.TLSClientConfig.ServerName = ""
	// The API server's own rate limit and QPS settings do not apply to the
	// kubelet, and MaxAge already bounds the calls.
	c.RateLimiter = nil
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubelet HTTP client: %w", err)
	}
	hc.Timeout = 10 * time.Second
	return &KubeletStats{client: hc, url: c.Host + "/stats/summary", MaxAge: 2 * time.Second}, nil
}

// KubeletStatsGetter is implemented by clients that can reach a node's
// kubelet with their own credentials.
type KubeletStatsGetter interface {
	KubeletStats(ctx context.Context, node string) (*KubeletStats, error)
}

// KubeletStats reads the Node (get nodes, which the agent has) for the
// kubelet's address and port, and builds its stats reader.
func (c *Client) KubeletStats(ctx context.Context, node string) (*KubeletStats, error) {
	n, err := c.Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", node, err)
	}
	return NewKubeletStats(c.cfg, n)
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

// ImageFs returns the kubelet's figures, at most MaxAge old.
func (k *KubeletStats) ImageFs(ctx context.Context) (ImageFs, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.at.IsZero() && time.Since(k.at) < k.MaxAge {
		return k.last, k.err
	}
	k.last, k.err = k.read(ctx)
	k.at = time.Now()
	return k.last, k.err
}

func (k *KubeletStats) read(ctx context.Context) (ImageFs, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return ImageFs{}, err
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return ImageFs{}, fmt.Errorf("kubelet stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return ImageFs{}, fmt.Errorf("kubelet stats: %s: %s (the agent needs get on nodes/stats)", resp.Status, body)
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
		return ImageFs{}, errors.New("kubelet stats: no image filesystem capacity in the summary")
	}
	return *fs, nil
}
