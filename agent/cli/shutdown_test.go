package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hungAPIServer answers GETs of the test node (without this instance's
// label, so that watch rewrites it) and never answers a PATCH: each one
// hangs until the test ends. It records the PATCH bodies as they arrive.
type hungAPIServer struct {
	srv     *httptest.Server
	mu      sync.Mutex
	patches []string
	arrived chan struct{}
}

func newHungAPIServer(t *testing.T) *hungAPIServer {
	t.Helper()
	h := &hungAPIServer{arrived: make(chan struct{}, 16)}
	release := make(chan struct{})
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+testNode:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"`+testNode+`","labels":{"kubernetes.io/hostname":"`+testNode+`"}}}`)
		case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/"+testNode:
			body, _ := io.ReadAll(r.Body)
			h.mu.Lock()
			h.patches = append(h.patches, string(body))
			h.mu.Unlock()
			h.arrived <- struct{}{}
			// Hang like an API server that accepted the connection and
			// never answers; only the end of the test frees the handler.
			<-release
		default:
			http.NotFound(w, r)
		}
	}))
	// Cleanups run last-in first-out: free the handlers, then close.
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() { close(release) })
	return h
}

func (h *hungAPIServer) bodies() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.patches...)
}

// kubeconfig writes a kubeconfig for the agent's own REST client.
func (h *hungAPIServer) kubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: hung
  cluster:
    server: ` + h.srv.URL + `
users:
- name: agent
  user:
    token: test
contexts:
- name: hung
  context: {cluster: hung, user: agent}
current-context: hung
`
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWatchSIGTERMWhileALabelPatchHangs is the hard bound: watch
// exits within 5 s of SIGTERM, even when the API server hangs on the label
// rewrite that is in flight and on the removal that follows.
func TestWatchSIGTERMWhileALabelPatchHangs(t *testing.T) {
	e := newEnv(t)
	api := newHungAPIServer(t)
	deps := e.deps()
	deps.Kube = nil // the production client, through --kubeconfig
	done := make(chan int, 1)
	args := e.agentArgs("watch", "--kubeconfig="+api.kubeconfig(t), "--refresh-interval=1h", "app:1")
	go func() { done <- Execute(context.Background(), args, deps) }()
	select {
	case <-api.arrived: // the first check's rewrite is in flight
	case code := <-done:
		t.Fatalf("watch exited with %d before patching:\n%s", code, e.logs)
	}

	start := time.Now()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("watch still running 30 s after SIGTERM:\n%s", e.logs)
	}
	d := time.Since(start)
	t.Logf("watch exited %v after SIGTERM", d.Round(time.Millisecond))
	if d >= 5*time.Second {
		t.Errorf("watch exited %v after SIGTERM; the bound is 5 s", d.Round(time.Millisecond))
	}
	// The removal could not succeed, and says so.
	if code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}
	bodies := api.bodies()
	if len(bodies) != 2 {
		t.Fatalf("%d patches, want the rewrite and the removal: %q", len(bodies), bodies)
	}
	if !strings.Contains(bodies[0], `"`+testKey+`":"succeeded"`) {
		t.Errorf("first patch is not the rewrite: %s", bodies[0])
	}
	if !strings.Contains(bodies[1], `"labels":{"`+testKey+`":null}`) || !strings.Contains(bodies[1], `"annotations":{"`+testKey+`":null}`) {
		t.Errorf("second patch is not the removal: %s", bodies[1])
	}
	logs := e.logs.String()
	for _, want := range []string{"label rewrite abandoned: terminating", "removing the node label failed"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}

// silentRuntime is a CRI socket whose runtime accepts connections and never
// answers, like a containerd that is still starting. It reports each
// connection.
func silentRuntime(t *testing.T) (string, chan struct{}) {
	t.Helper()
	dir, err := os.MkdirTemp("", "silentcri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan struct{}, 1)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case connected <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return sock, connected
}

func TestWatchTerminatedDuringStartUpExitsCleanly(t *testing.T) {
	tests := []struct {
		name      string
		extra     []string
		wantLabel bool
	}{
		{"removes the label fetch wrote", nil, false},
		{"keeps it when asked", []string{"--remove-label-on-exit=false"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if code := e.run(e.agentArgs("fetch", "app:1")...); code != 0 {
				t.Fatalf("fetch exit %d:\n%s", code, e.logs)
			}
			sock, connected := silentRuntime(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			args := append(e.agentArgs("watch", "--cri-socket="+sock, "--cri-connect-timeout=1h", "app:1"), tt.extra...)
			done := make(chan int, 1)
			go func() { done <- Execute(ctx, args, e.deps()) }()
			select {
			case <-connected: // waiting for the runtime's first answer
			case code := <-done:
				t.Fatalf("watch exited with %d before reaching the runtime:\n%s", code, e.logs)
			}
			// What SIGTERM does: the command's context ends.
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("exit %d, want 0:\n%s", code, e.logs)
			}
			select {
			case <-e.ready:
				t.Error("watch reported ready without a runtime")
			default:
			}
			logs := e.logs.String()
			if !strings.Contains(logs, "terminating during start-up") {
				t.Errorf("logs:\n%s", logs)
			}
			if strings.Contains(logs, "image-prefetcher: ") {
				t.Errorf("an error was reported:\n%s", logs)
			}
			if _, has := e.node(testNode).Labels[testKey]; has != tt.wantLabel {
				t.Errorf("label present %v, want %v", has, tt.wantLabel)
			}
			e.assertOthersUntouched()
		})
	}
}
