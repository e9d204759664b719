package cri

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/image-prefetcher/image-prefetcher/agent/ingest"
)

// ErrNoEvents is returned by WatchImageDeletes when the runtime serves no
// containerd events API (CRI-O).
var ErrNoEvents = errors.New("the runtime serves no image events")

const (
	subscribe = "/containerd.services.events.v1.Events/Subscribe"
	// imageDeleteFilter selects the image deletions of the CRI's
	// namespace: what the kubelet's image GC, crictl rmi and ctr images
	// rm cause.
	imageDeleteFilter = `topic=="/images/delete",namespace=="` + ingest.Namespace + `"`
)

// WatchImageDeletes follows containerd's event stream on the CRI socket
// and calls deleted with the name of each image record deleted in the CRI's
// namespace (a tag, a digest reference or the image ID), until ctx ends or
// the stream breaks; it returns why. subscribed is called once the request
// is sent: a deletion before it is not reported.
//
// The messages are encoded by hand, as agent/ingest's, so that the agent
// needs none of containerd's modules: SubscribeRequest{repeated string
// filters = 1}, Envelope{namespace = 2, topic = 3, Any event = 4},
// Any{type_url = 1, value = 2}, and the deletion's name = 1.
func (c *Client) WatchImageDeletes(ctx context.Context, subscribed func(), deleted func(name string)) error {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ingest.Namespace))
	defer cancel()
	stream, err := c.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, subscribe, grpc.ForceCodec(ingest.RawCodec{}))
	if err != nil {
		return c.eventsErr(err)
	}
	req := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), imageDeleteFilter)
	if err := stream.SendMsg(req); err != nil {
		return c.eventsErr(err)
	}
	if err := stream.CloseSend(); err != nil {
		return c.eventsErr(err)
	}
	subscribed()
	for {
		var msg []byte
		if err := stream.RecvMsg(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("containerd events on %s: the stream ended", c.Socket)
			}
			return c.eventsErr(err)
		}
		name, err := decodeImageDelete(msg)
		if err != nil {
			return fmt.Errorf("containerd events on %s: %w", c.Socket, err)
		}
		if name != "" {
			deleted(name)
		}
	}
}

func (c *Client) eventsErr(err error) error {
	if code := status.Code(err); code == codes.Unimplemented || code == codes.PermissionDenied {
		return fmt.Errorf("%w: %v", ErrNoEvents, err)
	}
	return c.after(fmt.Errorf("containerd events on %s: %w", c.Socket, err))
}

// decodeImageDelete returns the image name of an image deletion's
// envelope. The filter selects the topic, so the event's type is not
// checked (containerd 1.6.20 and 2.4.2 both send
// containerd.services.images.v1.ImageDelete, the name as its field 1).
func decodeImageDelete(b []byte) (string, error) {
	event, err := field(b, 4)
	if err != nil || event == nil {
		return "", err
	}
	value, err := field(event, 2)
	if err != nil {
		return "", err
	}
	name, err := field(value, 1)
	return string(name), err
}

// field returns the last length-delimited field num of a message, nil
// when absent.
func field(b []byte, num protowire.Number) ([]byte, error) {
	var out []byte
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, fmt.Errorf("decode event: %w", protowire.ParseError(l))
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, fmt.Errorf("decode event: %w", protowire.ParseError(l))
			}
			out = v
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return nil, fmt.Errorf("decode event: %w", protowire.ParseError(l))
		}
		b = b[l:]
	}
	return out, nil
}
