package creds

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const okResponse = `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","auth":{"r.example.com":{"username":"u","password":"p"}}}`

// gone reports whether the process whose pid is in file has ended, waiting
// a little: a killed orphan is reaped by init shortly after.
func gone(t *testing.T, file string) bool {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the child did not record its pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		// A zombie (state Z) has ended too.
		if err != nil || strings.Contains(string(st), ") Z ") || syscall.Kill(pid, 0) != nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return false
}

// A plugin that leaves a child holding its stdout must not hang the
// lookup: neither after the plugin exits at once, nor when the plugin
// itself hangs and its timeout kills it.
func TestHungPluginIsBounded(t *testing.T) {
	tests := []struct {
		name     string
		body     string // shell, after reading the request; $1 is the pid file
		timeout  time.Duration
		wantUser string // "" wants an error
	}{
		{"exits at once after answering, child holds stdout", "sh -c 'echo $$ > \"$PIDFILE\"; exec sleep 600' &\necho '" + okResponse + "'\nexit 0\n", time.Minute, "u"},
		{"exits at once without answering, child holds stdout", "sh -c 'echo $$ > \"$PIDFILE\"; exec sleep 600' &\nexit 0\n", time.Minute, ""},
		{"hangs, with a child holding stdout", "sh -c 'echo $$ > \"$PIDFILE\"; exec sleep 600' &\nsleep 600\n", time.Second, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := t.TempDir()
			pidfile := filepath.Join(bin, "child.pid")
			if err := os.WriteFile(filepath.Join(bin, "hung"), []byte("#!/bin/sh\ncat >/dev/null\n"+tt.body), 0o755); err != nil {
				t.Fatal(err)
			}
			pl := &Plugin{Spec: ProviderSpec{Name: "hung", MatchImages: []string{"r.example.com"}, APIVersion: ProviderAPIVersion,
				Env: []EnvVar{{Name: "PIDFILE", Value: pidfile}}}, Bin: filepath.Join(bin, "hung"), Timeout: tt.timeout, cache: map[string]cacheEntry{}}
			done := make(chan struct{})
			var got []Credential
			var err error
			start := time.Now()
			go func() {
				defer close(done)
				got, err = pl.Lookup(context.Background(), "r.example.com/a:1")
			}()
			// The bound is the plugin's timeout plus the wait for the
			// pipes, with room for a loaded machine.
			select {
			case <-done:
			case <-time.After(tt.timeout + pluginWaitDelay + 20*time.Second):
				t.Fatalf("lookup still running after %v", time.Since(start))
			}
			if tt.wantUser == "" && err == nil || tt.wantUser != "" && (err != nil || len(got) != 1 || got[0].Username != tt.wantUser) {
				t.Errorf("got %v, %v; want user %q", got, err, tt.wantUser)
			}
			if !gone(t, pidfile) {
				t.Error("the child holding stdout is still running")
			}
		})
	}
}
