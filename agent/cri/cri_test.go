package cri

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAbsSocket(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr string
	}{
		{name: "absolute", in: "/run/containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{name: "unix scheme", in: "unix:///var/run/crio/crio.sock", want: "/var/run/crio/crio.sock"},
		{name: "relative", in: "run/cri.sock", want: filepath.Join(wd, "run/cri.sock")},
		{name: "relative with unix scheme", in: "unix://cri.sock", want: filepath.Join(wd, "cri.sock")},
		{name: "cleaned", in: "/run//containerd/../containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{name: "empty", in: "", wantErr: "empty CRI socket path"},
		{name: "only the scheme", in: "unix://", wantErr: "empty CRI socket path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AbsSocket(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("AbsSocket(%q) = %q, %v; want error %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("AbsSocket(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestDialMissingSocket(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	// t.TempDir may be reached through a symlink; Abs keeps it, so compare
	// with what Abs says rather than with the resolved path.
	wantRel, err := filepath.Abs("no/such/cri.sock")
	if err != nil {
		t.Fatal(err)
	}
	// What a hostPath mount of a wrong criSocket leaves behind.
	emptyDir := filepath.Join(dir, "empty.sock")
	if err := os.Mkdir(emptyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		socket    string
		wantPath  string
		wantThere string // what the message says is there instead; "" for nothing
	}{
		{"absolute", filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "containerd.sock"), ""},
		{"relative", "no/such/cri.sock", wantRel, ""},
		{"unix scheme", "unix://" + filepath.Join(dir, "crio.sock"), filepath.Join(dir, "crio.sock"), ""},
		{"directory", emptyDir, emptyDir, "a directory is there instead of a socket"},
		{"directory with unix scheme", "unix://" + emptyDir, emptyDir, "a directory is there instead of a socket"},
		{"regular file", file, file, "a regular file is there instead of a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Dial(tt.socket)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded without a socket at the path")
			}
			if !errors.Is(err, ErrSocketMissing) {
				t.Errorf("error %v does not wrap ErrSocketMissing", err)
			}
			msg := err.Error()
			for _, want := range []string{"CRI socket not found at " + tt.wantPath + ":", "--cri-socket", "criSocket", tt.wantThere} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q lacks %q", msg, want)
				}
			}
			if tt.wantThere == "" && strings.Contains(msg, "instead of a socket") {
				t.Errorf("message %q says something is at a missing path", msg)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("message %q is more than one line", msg)
			}
		})
	}
}

func TestDialEmptySocket(t *testing.T) {
	if c, err := Dial(""); err == nil || errors.Is(err, ErrSocketMissing) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial(\"\") = %v; want the empty-path error, not a missing socket", err)
	}
}

// listen serves a unix socket at a short path (the unix socket path limit
// is near 100 bytes) and returns the path.
func listen(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "cri.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return p
}

func TestDialExistingSocket(t *testing.T) {
	// Dial does not connect (grpc connects lazily): what matters is that
	// a listening socket passes the check and the target is absolute.
	p := listen(t)
	link := filepath.Join(filepath.Dir(p), "link.sock")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, socket, want string
	}{
		{"socket", p, p},
		{"unix scheme", "unix://" + p, p},
		// /var/run is often a symlink to /run; the path is kept as given.
		{"symlink to a socket", link, link},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Dial(tt.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Socket != tt.want {
				t.Errorf("Socket = %q, want %q", c.Socket, tt.want)
			}
		})
	}
}
