// Package cri talks to the node's container runtime over the CRI image and
// runtime services.
package cri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/ingest"
)

// DefaultSocket is where containerd listens on most distributions.
const DefaultSocket = "/run/containerd/containerd.sock"

// ErrSocketMissing is returned by Dial when there is no unix socket at the
// socket path: nothing at all, or something else, such as the empty
// directory the kubelet creates for a hostPath mount of a missing path.
var ErrSocketMissing = errors.New("CRI socket not found")

// Auth is one set of registry credentials for a pull.
type Auth struct {
	Username      string
	Password      string
	Auth          string
	IdentityToken string
	RegistryToken string
	// ServerAddress carries a scheme (https://host): containerd drops
	// credentials whose address it cannot parse into a host.
	ServerAddress string
}

// LogValue keeps secrets out of logs even when an Auth is logged by mistake.
func (a Auth) LogValue() slog.Value {
	return slog.StringValue(a.String())
}

// String never prints secrets.
func (a Auth) String() string {
	return fmt.Sprintf("auth{server:%s user:%s secret:redacted}", a.ServerAddress, a.Username)
}

// GoString is used by %#v.
func (a Auth) GoString() string { return a.String() }

// ImageInfo is what the runtime says about a present image.
type ImageInfo struct {
	ID   string
	Size uint64
	// Pinned is true when the runtime keeps the image from the kubelet's
	// garbage collection (agent/pin).
	Pinned bool
}

// Client is a CRI client. The underlying grpc connection re-dials by itself
// when the runtime restarts; Client only shortens the re-dial backoff so that
// the next attempt after a restart finds the runtime again quickly.
type Client struct {
	Socket string
	conn   *grpc.ClientConn
	rt     runtimeapi.RuntimeServiceClient
	img    runtimeapi.ImageServiceClient
}

// AbsSocket returns the absolute socket path, with any unix:// prefix removed.
func AbsSocket(socket string) (string, error) {
	socket = strings.TrimPrefix(socket, "unix://")
	if socket == "" {
		return "", fmt.Errorf("empty CRI socket path")
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return "", fmt.Errorf("resolve CRI socket path %q: %w", socket, err)
	}
	return abs, nil
}

// Dial connects to the runtime. It checks that a unix socket is at the path
// first, so that the common misconfiguration gives one clear message instead
// of a retry loop: grpc connects lazily, and a directory or a file at the
// path would only show up as a runtime that does not answer.
func Dial(socket string) (*Client, error) {
	abs, err := AbsSocket(socket)
	if err != nil {
		return nil, err
	}
	if err := checkSocket(abs); err != nil {
		return nil, err
	}
	bc := backoff.DefaultConfig
	bc.MaxDelay = 2 * time.Second
	conn, err := grpc.NewClient("unix://"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 5 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", abs, err)
	}
	return &Client{
		Socket: abs,
		conn:   conn,
		rt:     runtimeapi.NewRuntimeServiceClient(conn),
		img:    runtimeapi.NewImageServiceClient(conn),
	}, nil
}

// checkSocket returns ErrSocketMissing, with the likely fix, unless abs is
// a unix socket (or a symlink to one).
func checkSocket(abs string) error {
	const fix = "is the container runtime running on this node, and does --cri-socket (the criSocket setting) point at its socket?"
	fi, err := os.Stat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w at %s: %s", ErrSocketMissing, abs, fix)
	}
	if err != nil {
		return fmt.Errorf("CRI socket %s: %w", abs, err)
	}
	mode := fi.Mode()
	switch {
	case mode&os.ModeSocket != 0:
		return nil
	case mode.IsDir():
		// A hostPath mount of a path that does not exist leaves an empty
		// directory there: the kubelet makes one for DirectoryOrCreate, and
		// containerd for a hostPath without a type.
		return fmt.Errorf("%w at %s: a directory is there instead of a socket (a hostPath mount of a path that does not exist creates an empty one); %s", ErrSocketMissing, abs, fix)
	case mode.IsRegular():
		return fmt.Errorf("%w at %s: a regular file is there instead of a socket; %s", ErrSocketMissing, abs, fix)
	}
	return fmt.Errorf("%w at %s: a file of mode %s is there instead of a socket; %s", ErrSocketMissing, abs, mode.Type(), fix)
}

// Conn is the connection to the runtime, for the APIs a runtime serves
// beside the CRI on the same socket (containerd's images API: agent/pin).
func (c *Client) Conn() grpc.ClientConnInterface { return c.conn }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// after resets the re-dial backoff when the runtime looks gone, so that a
// restarted containerd is found on the very next call.
func (c *Client) after(err error) error {
	if status.Code(err) == codes.Unavailable {
		c.conn.ResetConnectBackoff()
	}
	return err
}

// Version returns the runtime's name and version.
func (c *Client) Version(ctx context.Context) (name, version string, err error) {
	resp, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{Version: "v1"})
	if err != nil {
		return "", "", c.after(fmt.Errorf("CRI Version on %s: %w", c.Socket, err))
	}
	return resp.GetRuntimeName(), resp.GetRuntimeVersion(), nil
}

// ImageStatus reports whether ref is present. An absent image is not an
// error: the runtime answers OK with no image.
func (c *Client) ImageStatus(ctx context.Context, ref string) (*ImageInfo, error) {
	resp, err := c.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return nil, c.after(fmt.Errorf("CRI ImageStatus %s: %w", ref, err))
	}
	if resp.GetImage() == nil {
		return nil, nil
	}
	img := resp.GetImage()
	return &ImageInfo{ID: img.GetId(), Size: img.GetSize(), Pinned: img.GetPinned()}, nil
}

// PullImage pulls ref, with auth when it is not nil, and returns the image
// reference the runtime reports.
func (c *Client) PullImage(ctx context.Context, ref string, auth *Auth) (string, error) {
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}
	if auth != nil {
		req.Auth = &runtimeapi.AuthConfig{
			Username:      auth.Username,
			Password:      auth.Password,
			Auth:          auth.Auth,
			IdentityToken: auth.IdentityToken,
			RegistryToken: auth.RegistryToken,
			ServerAddress: auth.ServerAddress,
		}
	}
	resp, err := c.img.PullImage(ctx, req)
	if err != nil {
		// Keep the gRPC status in the chain: the classifier reads its code.
		return "", c.after(fmt.Errorf("CRI PullImage %s: %w", ref, err))
	}
	return resp.GetImageRef(), nil
}

// Downloads returns the bytes received so far of each blob the runtime is
// downloading, through containerd's content API on the same socket
// (agent/ingest). Only containerd serves it: ask only when Version said
// "containerd". It satisfies pull.Progress.
func (c *Client) Downloads(ctx context.Context) (map[string]int64, error) {
	list, err := ingest.List(ctx, c.conn)
	if err != nil {
		if errors.Is(err, ingest.ErrUnsupported) {
			return nil, fmt.Errorf("%w: %w", errors.ErrUnsupported, err)
		}
		return nil, c.after(err)
	}
	out := make(map[string]int64, len(list))
	for _, s := range list {
		out[s.Ref] = s.Offset
	}
	return out, nil
}

// Filesystem is one image filesystem as the runtime reports it.
type Filesystem struct {
	// Mountpoint is the directory the runtime keeps its images in.
	Mountpoint string
	// UsedBytes is what the images take there, by the runtime's count.
	UsedBytes uint64
}

// ImageFsInfo returns the runtime's image filesystems. The CRI gives no
// capacity: statfs of the mountpoint does (agent/disk).
func (c *Client) ImageFsInfo(ctx context.Context) ([]Filesystem, error) {
	resp, err := c.img.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		return nil, c.after(fmt.Errorf("CRI ImageFsInfo on %s: %w", c.Socket, err))
	}
	out := make([]Filesystem, 0, len(resp.GetImageFilesystems()))
	for _, fs := range resp.GetImageFilesystems() {
		out = append(out, Filesystem{Mountpoint: fs.GetFsId().GetMountpoint(), UsedBytes: fs.GetUsedBytes().GetValue()})
	}
	return out, nil
}

// ListedImage is one image the runtime lists: its ID, and the tags and
// digest references it is known by.
type ListedImage struct {
	ID    string
	Names []string
}

// ListImages returns every image the runtime holds.
func (c *Client) ListImages(ctx context.Context) ([]ListedImage, error) {
	resp, err := c.img.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, c.after(fmt.Errorf("CRI ListImages on %s: %w", c.Socket, err))
	}
	out := make([]ListedImage, 0, len(resp.GetImages()))
	for _, img := range resp.GetImages() {
		out = append(out, ListedImage{ID: img.GetId(), Names: append(slices.Clone(img.GetRepoTags()), img.GetRepoDigests()...)})
	}
	return out, nil
}
