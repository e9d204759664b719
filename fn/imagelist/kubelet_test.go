package imagelist

import "testing"

func TestKubeletRef(t *testing.T) {
	// What pkg/kubelet/images.applyDefaultImageTag makes of each.
	for _, c := range []struct{ in, want string }{
		{"busybox", "busybox:latest"},
		{"app", "app:latest"},
		{"busybox:1.36", "busybox:1.36"},
		{"library/busybox", "library/busybox:latest"},
		{"docker.io/library/busybox", "docker.io/library/busybox:latest"},
		{"127.0.0.1:5000/team/app", "127.0.0.1:5000/team/app:latest"},
		{"127.0.0.1:5000/team/app:v1", "127.0.0.1:5000/team/app:v1"},
		{"busybox@sha256:" + hex64, "busybox@sha256:" + hex64},
		{"quay.io/x/y:1@sha256:" + hex64, "quay.io/x/y:1@sha256:" + hex64},
	} {
		got, err := KubeletRef(c.in)
		if err != nil || got != c.want {
			t.Errorf("KubeletRef(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	if _, err := KubeletRef("Bad::Ref"); err == nil {
		t.Error("KubeletRef accepted an invalid reference")
	}
}
