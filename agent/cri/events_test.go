package cri

import (
	"testing"

	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/proto"
)

// Envelopes as containerd sent them to a subscriber after `ctr -n k8s.io
// images rm docker.io/x/data:1`, recorded from 1.6.20 and 2.4.2, decode
// with containerd's own types: the stream WatchImageDeletes reads.
func TestImageDeleteEnvelopes(t *testing.T) {
	tests := []struct{ name, msg string }{
		{"containerd 1.6.20", "\n\f\b\x8e\xb4\xa3\xd8\x06\x10\xa5\xa5\xb5\x98\x01\x12\x06k8s.io\x1a\x0e/images/delete\"A\n)containerd.services.images.v1.ImageDelete\x12\x14\n\x12docker.io/x/data:1"},
		{"containerd 2.4.2", "\n\f\b\xb4\xbd\xa3\xd8\x06\x10\xbc\x8f\xfb\xaa\x02\x12\x06k8s.io\x1a\x0e/images/delete\"A\n)containerd.services.images.v1.ImageDelete\x12\x14\n\x12docker.io/x/data:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var env types.Envelope
			if err := proto.Unmarshal([]byte(tt.msg), &env); err != nil {
				t.Fatal(err)
			}
			if env.GetTopic() != "/images/delete" || env.GetNamespace() != "k8s.io" || env.GetEvent().GetTypeUrl() != "containerd.services.images.v1.ImageDelete" {
				t.Errorf("envelope %v", &env)
			}
			if got := deletedName(&env); got != "docker.io/x/data:1" {
				t.Errorf("deleted record %q, want docker.io/x/data:1", got)
			}
		})
	}
}
