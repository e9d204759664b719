// Package fakecri is an in-process CRI server on a unix socket, scripted
// per image, for tests of the agent against real gRPC.
package fakecri

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Behavior decides the outcome of the n-th (1-based) PullImage call for an
// image. Returning nil makes the image present.
type Behavior func(ctx context.Context, n int, req *runtimeapi.PullImageRequest) error

// PullCall records one PullImage request.
type PullCall struct {
	Image string
	Auth  *runtimeapi.AuthConfig
	// Timeout is what was left of the caller's deadline on arrival; zero
	// when the call had no deadline.
	Timeout time.Duration
	Err     error
}

// Server is the fake runtime.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	Socket string

	mu        sync.Mutex
	images    map[string]uint64
	behaviors map[string]Behavior
	fallback  Behavior
	calls     map[string]int
	pulls     []PullCall // in arrival order
	inflight  sync.WaitGroup
	active    int // PullImage handlers running
	maxActive int
	statuses  int
	grpc      *grpc.Server
	dir       string
}

// New returns a server with a socket path in a fresh temporary directory
// (short, to stay within the unix socket path limit). Call Start.
func New() (*Server, error) {
	dir, err := os.MkdirTemp("", "fakecri")
	if err != nil {
		return nil, err
	}
	return &Server{
		Socket:    filepath.Join(dir, "cri.sock"),
		dir:       dir,
		images:    map[string]uint64{},
		behaviors: map[string]Behavior{},
		calls:     map[string]int{},
	}, nil
}

// Start listens on Socket and serves in the background.
func (s *Server) Start() error {
	_ = os.Remove(s.Socket)
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		return fmt.Errorf("fake CRI listen: %w", err)
	}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	runtimeapi.RegisterImageServiceServer(g, s)
	s.mu.Lock()
	s.grpc = g
	s.mu.Unlock()
	go func() { _ = g.Serve(ln) }()
	return nil
}

// Stop stops serving, as a runtime restart does. Start may be called again.
func (s *Server) Stop() {
	s.mu.Lock()
	g := s.grpc
	s.grpc = nil
	s.mu.Unlock()
	if g != nil {
		g.Stop()
	}
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	s.Stop()
	_ = os.RemoveAll(s.dir)
}

// AddImage makes ref present.
func (s *Server) AddImage(ref string, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.images[ref] = size
}

// DeleteImage removes ref, as image garbage collection does.
func (s *Server) DeleteImage(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.images, ref)
}

// DeleteAll removes every image.
func (s *Server) DeleteAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.images)
}

// SetDefaultBehavior scripts PullImage for images without a behavior of
// their own.
func (s *Server) SetDefaultBehavior(b Behavior) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fallback = b
}

// HasImage reports whether ref is present.
func (s *Server) HasImage(ref string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.images[ref]
	return ok
}

// SetBehavior scripts PullImage for ref. Without one, pulls succeed.
func (s *Server) SetBehavior(ref string, b Behavior) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.behaviors[ref] = b
}

// Settle waits for every PullImage handler still running, such as one whose
// caller gave up: their outcomes land in Pulls only when they return. Call
// it once the client is done, when no new pulls are coming.
func (s *Server) Settle() { s.inflight.Wait() }

// Pulls returns every PullImage call so far in arrival order, for all
// images or for one. Err is nil for a call whose handler is still running;
// call Settle first to see every outcome.
func (s *Server) Pulls(ref string) []PullCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PullCall
	for _, p := range s.pulls {
		if ref == "" || p.Image == ref {
			out = append(out, p)
		}
	}
	return out
}

// MaxConcurrentPulls is the largest number of PullImage calls the server
// was working on at once so far. A call counts from its arrival until its
// behavior returns, which is before the client sees the answer: a client
// that waits for answers before sending more cannot push it past its bound.
// A call that times out can: the client moves on at its deadline, maybe
// before the handler has returned.
func (s *Server) MaxConcurrentPulls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxActive
}

// StatusCalls is the number of ImageStatus calls so far.
func (s *Server) StatusCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statuses
}

// Version answers like a runtime would.
func (s *Server) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fakecri", RuntimeVersion: "v1.0.0", RuntimeApiVersion: "v1"}, nil
}

// ImageStatus answers OK with a nil image when ref is absent, as containerd does.
func (s *Server) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statuses++
	ref := req.GetImage().GetImage()
	size, ok := s.images[ref]
	if !ok {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:" + ref, RepoTags: []string{ref}, Size: size}}, nil
}

// PullImage runs the image's behavior.
func (s *Server) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	call := PullCall{Image: ref, Auth: req.GetAuth()}
	if dl, ok := ctx.Deadline(); ok {
		call.Timeout = time.Until(dl)
	}
	s.inflight.Add(1)
	defer s.inflight.Done()
	// Recorded on arrival, not on return: a handler of a timed-out call
	// can return after the client's next attempt has already succeeded.
	s.mu.Lock()
	s.calls[ref]++
	n := s.calls[ref]
	b := s.behaviors[ref]
	if b == nil {
		b = s.fallback
	}
	i := len(s.pulls)
	s.pulls = append(s.pulls, call)
	s.active++
	s.maxActive = max(s.maxActive, s.active)
	s.mu.Unlock()
	var err error
	if b != nil {
		err = b(ctx, n, req)
	}
	s.mu.Lock()
	s.active--
	s.pulls[i].Err = err
	if err == nil {
		s.images[ref] = 1000
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + ref}, nil
}

// The errors below carry containerd 1.6.20's exact codes and messages.

const pullPrefix = "failed to pull and unpack image %q: "

// NotFound is a missing tag, repository or digest.
func NotFound(ref string) error {
	return status.Errorf(codes.NotFound, pullPrefix+"failed to resolve reference %q: %s: not found", ref, ref, ref)
}

// BlobNotFound is a missing blob.
func BlobNotFound(ref string) error {
	return status.Errorf(codes.NotFound, pullPrefix+"failed to copy: httpReadSeeker: failed open: could not fetch content descriptor sha256:0123 (application/vnd.oci.image.layer.v1.tar+gzip, 1234 bytes) from remote: not found", ref)
}

// HTTPStatus is a registry answer such as "401 Unauthorized" or
// "503 Service Unavailable" from host. containerd's resolver names the path
// it asked for as [manifests <tag or digest>].
func HTTPStatus(ref, host, code string) error {
	_, _, object := split(ref)
	return status.Errorf(codes.Unknown, pullPrefix+"failed to resolve reference %q: pulling from host %s failed with status code [manifests %s]: %s", ref, ref, host, object, code)
}

// PullAccessDenied is Docker Hub's answer for a repository that does not
// exist, or that is private and the credentials (if any) cannot read: it
// answers 401 with error="insufficient_scope" even after a token was
// fetched, and containerd's resolver (remotes/docker/resolver.go, wrapping
// authorizer.go's invalidAuthorization) turns that into this text, which
// carries no HTTP status and no errdefs kind, so it reaches the CRI client
// as codes.Unknown.
func PullAccessDenied(ref string) error {
	return status.Errorf(codes.Unknown, pullPrefix+"failed to resolve reference %q: pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed", ref, ref)
}

// ConnectionRefused is a registry that is down; addr is the address dialed
// (Go's dial error names the resolved IP and port, not the host name).
func ConnectionRefused(ref, addr string) error {
	host, repo, object := split(ref)
	return status.Errorf(codes.Unknown, pullPrefix+"failed to resolve reference %q: failed to do request: Head %q: dial tcp %s: connect: connection refused",
		ref, ref, scheme(host)+"://"+host+"/v2/"+repo+"/manifests/"+object, addr)
}

// NoMatchForPlatform is an image with no manifest for the node's platform.
// containerd wraps errdefs.ErrNotFound here, so the code is NotFound.
func NoMatchForPlatform(ref string) error {
	return status.Errorf(codes.NotFound, pullPrefix+"no match for platform in manifest: not found", ref)
}

// split cuts a normalized reference the way containerd's resolver sees it:
// the registry host it connects to, the repository path, and the manifest
// object it asks for (the digest when there is one, else the tag).
func split(ref string) (host, repo, object string) {
	host, rest, _ := strings.Cut(ref, "/")
	if host == "docker.io" {
		host = "registry-1.docker.io"
	}
	name, digest, pinned := strings.Cut(rest, "@")
	if i := strings.LastIndex(name, ":"); i >= 0 {
		repo, object = name[:i], name[i+1:]
	} else {
		repo, object = name, "latest"
	}
	if pinned {
		object = digest
	}
	return host, repo, object
}

// scheme is containerd 1.6's CRI default for a registry without hosts.toml
// (defaultScheme with docker.IsLocalhost): plain HTTP for localhost and
// loopback addresses, HTTPS for every other host.
func scheme(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" || net.ParseIP(host).IsLoopback() {
		return "http"
	}
	return "https"
}

// InvalidReference is a malformed reference.
func InvalidReference(ref string) error {
	return status.Errorf(codes.Unknown, "failed to parse image reference %q: invalid reference format: repository name must be lowercase", ref)
}

// Stall blocks until the caller's deadline passes.
func Stall(ctx context.Context) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}
