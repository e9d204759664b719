package cri

import (
	"context"
	"errors"
	"fmt"
	"io"

	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

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
// (a tag, a digest reference or the image ID), until ctx ends or the
// stream breaks; it returns why. subscribed is called once the request is
// sent: a deletion before it is not reported. Which record went is not
// passed on: a deletion is only a reason to ask ImageStatus, which
// decides (agent/presence).
func (c *Client) WatchImageDeletes(ctx context.Context, subscribed func(), deleted func()) error {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ingest.Namespace))
	defer cancel()
	stream, err := eventsapi.NewEventsClient(c.conn).Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: []string{imageDeleteFilter}})
	if err != nil {
		return c.eventsErr(err)
	}
	subscribed()
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("containerd events on %s: the stream ended", c.Socket)
			}
			return c.eventsErr(err)
		}
		deleted()
	}
}

func (c *Client) eventsErr(err error) error {
	if code := status.Code(err); code == codes.Unimplemented || code == codes.PermissionDenied {
		return fmt.Errorf("%w: %v", ErrNoEvents, err)
	}
	return c.after(fmt.Errorf("containerd events on %s: %w", c.Socket, err))
}
