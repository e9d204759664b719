package cri

import (
	"context"
	"errors"
	"fmt"
	"io"

	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/image-prefetcher/image-prefetcher/agent/ingest"
)

// ErrNoEvents is returned by WatchImageDeletes when the runtime serves no
// containerd events API (CRI-O).
var ErrNoEvents = errors.New("the runtime serves no image events")

// imageDeleteFilter selects the image deletions of the CRI's namespace:
// what the kubelet's image GC, crictl rmi and ctr images rm cause.
const imageDeleteFilter = `topic=="/images/delete",namespace=="` + ingest.Namespace + `"`

// WatchImageDeletes follows containerd's event stream on the CRI socket
// and calls deleted for each image record deleted in the CRI's namespace
// (a tag, a digest reference or the image ID), with the record's name,
// until ctx ends or the stream breaks; it returns why. subscribed is
// called once the request is sent: a deletion before it is not reported.
// The name only says which images to ask ImageStatus about, which decides
// (agent/presence); it is "" when the event cannot be read.
func (c *Client) WatchImageDeletes(ctx context.Context, subscribed func(), deleted func(name string)) error {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ingest.Namespace))
	defer cancel()
	stream, err := eventsapi.NewEventsClient(c.conn).Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: []string{imageDeleteFilter}})
	if err != nil {
		return c.eventsErr(err)
	}
	subscribed()
	for {
		env, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("containerd events on %s: the stream ended", c.Socket)
			}
			return c.eventsErr(err)
		}
		deleted(deletedName(env))
	}
}

// deletedName is the name of the image record an /images/delete event
// names (containerd's ImageDelete, whose field 1 is the name), or "" when
// it cannot be read. Read by hand: containerd's event types would bring
// in its type registry for one string.
func deletedName(env *types.Envelope) string {
	b := env.GetEvent().GetValue()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ""
			}
			return string(v)
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

func (c *Client) eventsErr(err error) error {
	if code := status.Code(err); code == codes.Unimplemented || code == codes.PermissionDenied {
		return fmt.Errorf("%w: %v", ErrNoEvents, err)
	}
	return c.after(fmt.Errorf("containerd events on %s: %w", c.Socket, err))
}
