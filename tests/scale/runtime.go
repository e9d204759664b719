package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
)

// transferClient asks the harness's Bandwidth, over its unix socket, to
// move bytes to a node.
type transferClient struct {
	hc *http.Client
}

func newTransferClient(socket string) *transferClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     time.Minute,
	}
	return &transferClient{hc: &http.Client{Transport: tr}}
}

func (c *transferClient) transfer(ctx context.Context, node string, size int64) error {
	u := "http://registry/transfer?" + url.Values{"node": {node}, "bytes": {strconv.FormatInt(size, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("transfer: %s", resp.Status)
	}
	return nil
}

// downloads asks for node's transfers in progress.
func (c *transferClient) downloads(ctx context.Context, node string) (map[string]int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://registry/downloads?"+url.Values{"node": {node}}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("downloads: %w", err)
	}
	defer resp.Body.Close()
	var out map[string]int64
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("downloads: %w", err)
	}
	return out, nil
}

// fakeRuntime is one node's container runtime: an image store that starts
// empty, and pulls whose time is the simulated registry's.
type fakeRuntime struct {
	node   string
	sizes  map[string]int64
	client *transferClient

	mu      sync.Mutex
	present map[string]bool
}

var (
	_ pull.Runtime  = (*fakeRuntime)(nil)
	_ pull.Progress = (*fakeRuntime)(nil)
)

// Downloads are the node's transfers in progress, so that an attempt is
// cut only after a time without bytes arriving, as on containerd.
func (r *fakeRuntime) Downloads(ctx context.Context) (map[string]int64, error) {
	return r.client.downloads(ctx, r.node)
}

func (r *fakeRuntime) ImageStatus(_ context.Context, ref string) (*cri.ImageInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.present[ref] {
		return nil, nil
	}
	return &cri.ImageInfo{ID: "sha256:" + ref, Size: uint64(r.sizes[ref])}, nil
}

func (r *fakeRuntime) PullImage(ctx context.Context, ref string, _ *cri.Auth) (string, error) {
	size, ok := r.sizes[ref]
	if !ok {
		return "", fmt.Errorf("rpc error: code = NotFound desc = failed to pull and unpack image %q: not found", ref)
	}
	if err := r.client.transfer(ctx, r.node, size); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("rpc error: code = Canceled desc = failed to pull image %q: %w", ref, ctx.Err())
		}
		return "", fmt.Errorf("rpc error: code = Unavailable desc = failed to pull image %q: %w", ref, err)
	}
	r.mu.Lock()
	r.present[ref] = true
	r.mu.Unlock()
	return "sha256:" + ref, nil
}
