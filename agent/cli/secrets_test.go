package cli

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/internal/fakecri"
)

// swapSecret updates a Secret volume the way the kubelet's atomic writer
// does: a new timestamped directory, then a rename of the ..data symlink.
func swapSecret(t *testing.T, dir, version, password string) {
	t.Helper()
	ts := "..2026_11_24_" + version
	doc := `{"auths":{"r.example.com":{"username":"u","password":"` + password + `"}}}`
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ts, ".dockerconfigjson"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, ".dockerconfigjson")
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		if err := os.Symlink("..data/.dockerconfigjson", link); err != nil {
			t.Fatal(err)
		}
	}
}

// After the pull secret is rotated in place and the image is garbage
// collected, watch re-pulls it with the new password: the label stays
// succeeded, without a pod restart.
func TestWatchUsesARotatedPullSecret(t *testing.T) {
	e := newEnv(t)
	ref := "r.example.com/team/app:1"
	var password atomic.Value
	password.Store("old")
	e.cri.SetBehavior(ref, func(_ context.Context, _ int, req *runtimeapi.PullImageRequest) error {
		if a := req.GetAuth(); a != nil && a.GetUsername() == "u" && a.GetPassword() == password.Load().(string) {
			return nil
		}
		return fakecri.HTTPStatus(ref, "r.example.com", "401 Unauthorized")
	})
	secret := t.TempDir()
	swapSecret(t, secret, "a", "old")
	done := e.startWatch("--refresh-interval=10ms", "--docker-config="+secret, ref)
	waitFor(t, "label succeeded", e.labelIs("succeeded"))

	// The registry token is refreshed: the old password stops working and
	// the kubelet writes the new one into the mounted Secret.
	password.Store("new")
	swapSecret(t, secret, "b", "new")
	pulls := len(e.cri.Pulls(ref))
	e.cri.DeleteImage(ref)
	waitFor(t, "re-pull", func() bool { return len(e.cri.Pulls(ref)) > pulls && e.cri.HasImage(ref) })
	// The label is written after the pull.
	waitFor(t, "label succeeded, the image present, after the re-pull", func() bool {
		v, s, _ := e.state()
		return v == "succeeded" && s.Present == 1
	})
	if code := e.sigterm(done); code != 0 {
		t.Fatalf("exit %d:\n%s", code, e.logs)
	}
}
