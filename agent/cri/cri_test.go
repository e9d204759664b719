package cri

import (
	"errors"
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
	tests := []struct {
		name     string
		socket   string
		wantPath string
	}{
		{"absolute", filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "containerd.sock")},
		{"relative", "no/such/cri.sock", wantRel},
		{"unix scheme", "unix://" + filepath.Join(dir, "crio.sock"), filepath.Join(dir, "crio.sock")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Dial(tt.socket)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded on a missing socket")
			}
			if !errors.Is(err, ErrSocketMissing) {
				t.Errorf("error %v does not wrap ErrSocketMissing", err)
			}
			msg := err.Error()
			for _, want := range []string{"at " + tt.wantPath + ":", "--cri-socket", "criSocket"} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q lacks %q", msg, want)
				}
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

func TestDialExistingSocket(t *testing.T) {
	// Dial does not connect (grpc connects lazily), so any file at the path
	// gets past the existence check; what matters is the absolute target.
	p := filepath.Join(t.TempDir(), "cri.sock")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Dial("unix://" + p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Socket != p {
		t.Errorf("Socket = %q, want %q", c.Socket, p)
	}
}
