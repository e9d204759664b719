package runtimes_test

import (
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/image-prefetcher/image-prefetcher/agent/ingest"
)

// criProxy sits between the agent and a runtime's socket, forwards every
// call as it is (CRI and containerd's own APIs, unary and streaming), and
// counts the calls by method: what the agent costs the runtime.
type criProxy struct {
	Socket string

	mu    sync.Mutex
	calls map[string]int
}

func startCRIProxy(t *testing.T, backendSocket string) *criProxy {
	t.Helper()
	dir, err := os.MkdirTemp("", "cri-proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &criProxy{Socket: filepath.Join(dir, "cri.sock"), calls: map[string]int{}}
	backend, err := grpc.NewClient("unix://"+backendSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", p.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(ingest.RawCodec{}), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		p.mu.Lock()
		p.calls[method]++
		p.mu.Unlock()
		ctx := ss.Context()
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if ns := md.Get("containerd-namespace"); len(ns) > 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ns[0])
			}
		}
		cs, err := backend.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodec(ingest.RawCodec{}))
		if err != nil {
			return err
		}
		go func() {
			for {
				var msg []byte
				if err := ss.RecvMsg(&msg); err != nil {
					_ = cs.CloseSend()
					return
				}
				if err := cs.SendMsg(msg); err != nil {
					return
				}
			}
		}()
		for {
			var msg []byte
			if err := cs.RecvMsg(&msg); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if err := ss.SendMsg(msg); err != nil {
				return err
			}
		}
	}))
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		backend.Close()
	})
	return p
}

// Calls returns the calls so far, by method.
func (p *criProxy) Calls() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.calls)
}

// since is the calls made after before, by method, and their total.
func since(before, after map[string]int) (map[string]int, int) {
	out, total := map[string]int{}, 0
	for m, n := range after {
		if d := n - before[m]; d > 0 {
			out[m] = d
			total += d
		}
	}
	return out, total
}
