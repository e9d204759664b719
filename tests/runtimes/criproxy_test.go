package runtimes_test

import (
	"context"
	"errors"
	"fmt"
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
)

// criProxy sits between the agent and a runtime's socket, forwards every
// call as it is (CRI and containerd's own APIs, unary and streaming), and
// counts the calls by method: what the agent costs the runtime. It also
// counts the messages it passed on to the agent, by method: a test can
// wait until an event of containerd's stream reached the agent.
type criProxy struct {
	Socket string

	mu    sync.Mutex
	calls map[string]int
	sent  map[string]int
}

func startCRIProxy(t *testing.T, backendSocket string) *criProxy {
	t.Helper()
	dir, err := os.MkdirTemp("", "cri-proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &criProxy{Socket: filepath.Join(dir, "cri.sock"), calls: map[string]int{}, sent: map[string]int{}}
	backend, err := grpc.NewClient("unix://"+backendSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", p.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		p.mu.Lock()
		p.calls[method]++
		p.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		context.AfterFunc(ss.Context(), cancel)
		if md, ok := metadata.FromIncomingContext(ss.Context()); ok {
			if ns := md.Get("containerd-namespace"); len(ns) > 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ns[0])
			}
		}
		// No CRI or containerd call the agent makes streams requests: one
		// request, then one answer or a stream of them.
		var req []byte
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		cs, err := backend.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return err
		}
		if err := cs.SendMsg(req); err != nil {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
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
			p.mu.Lock()
			p.sent[method]++
			p.mu.Unlock()
		}
	}))
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		backend.Close()
	})
	return p
}

// rawCodec passes messages through as they are, as application/grpc, the
// content type of generated clients: CRI-O 1.34 resets the connection of a
// request sent as application/grpc+proto.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*p = append((*p)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "" }

// Calls returns the calls so far, by method.
func (p *criProxy) Calls() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.calls)
}

// Sent is how many messages of method the proxy passed on to its client.
func (p *criProxy) Sent(method string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[method]
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
