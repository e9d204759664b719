package cri

import "testing"

// Envelopes as containerd sent them to a subscriber after `ctr -n k8s.io
// images rm docker.io/x/data:1`: recorded from 1.6.20 and 2.4.2.
func TestDecodeImageDelete(t *testing.T) {
	tests := []struct {
		name, msg, want string
	}{
		{"containerd 1.6.20", "\n\f\b\x8e\xb4\xa3\xd8\x06\x10\xa5\xa5\xb5\x98\x01\x12\x06k8s.io\x1a\x0e/images/delete\"A\n)containerd.services.images.v1.ImageDelete\x12\x14\n\x12docker.io/x/data:1", "docker.io/x/data:1"},
		{"containerd 2.4.2", "\n\f\b\xb4\xbd\xa3\xd8\x06\x10\xbc\x8f\xfb\xaa\x02\x12\x06k8s.io\x1a\x0e/images/delete\"A\n)containerd.services.images.v1.ImageDelete\x12\x14\n\x12docker.io/x/data:1", "docker.io/x/data:1"},
		{"no event", "\x12\x06k8s.io\x1a\x0e/images/delete", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeImageDelete([]byte(tt.msg))
			if err != nil || got != tt.want {
				t.Errorf("decodeImageDelete = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if _, err := decodeImageDelete([]byte("\x22\x41\x0a")); err == nil {
		t.Error("a truncated envelope decoded without error")
	}
}
