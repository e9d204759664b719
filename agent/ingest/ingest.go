// Package ingest reads how far a containerd runtime has got with the blobs
// it is downloading. The CRI has no such call, but containerd serves its
// own content API on the CRI socket: ListStatuses lists the ingests in
// flight (one per blob being written to the content store) with the bytes
// received so far. CRI-O serves no such API and answers Unimplemented.
//
// The messages are encoded by hand (a request with no filter, and the few
// fields of the answer that matter) so that the agent needs none of
// containerd's modules.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Namespace is the containerd namespace the CRI plugin pulls into.
const Namespace = "k8s.io"

const listStatuses = "/containerd.services.content.v1.Content/ListStatuses"

// ErrUnsupported is returned when the runtime serves no content API
// (CRI-O), or refuses it.
var ErrUnsupported = errors.New("the runtime reports no download progress")

// Status is one blob being downloaded.
type Status struct {
	Ref string
	// Offset is the bytes received so far, Total the blob's size (0 when
	// not known yet).
	Offset, Total int64
	UpdatedAt     time.Time
}

// List returns the ingests in flight in the CRI's namespace.
func List(ctx context.Context, conn grpc.ClientConnInterface) ([]Status, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", Namespace)
	var resp []byte
	if err := conn.Invoke(ctx, listStatuses, []byte{}, &resp, grpc.ForceCodec(RawCodec{})); err != nil {
		switch status.Code(err) {
		case codes.Unimplemented, codes.PermissionDenied:
			return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return nil, fmt.Errorf("containerd content ListStatuses: %w", err)
	}
	return decodeList(resp)
}

// decodeList reads a ListStatusesResponse: repeated Status statuses = 1.
func decodeList(b []byte) ([]Status, error) {
	var out []Status
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("decode ListStatuses: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("decode ListStatuses: %w", protowire.ParseError(n))
			}
			s, err := decodeStatus(v)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, fmt.Errorf("decode ListStatuses: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return out, nil
}

// decodeStatus reads a Status: updated_at = 2 (a Timestamp), ref = 3,
// offset = 4, total = 5.
func decodeStatus(b []byte) (Status, error) {
	var s Status
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return s, fmt.Errorf("decode Status: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return s, fmt.Errorf("decode Status.updated_at: %w", protowire.ParseError(n))
			}
			t, err := decodeTimestamp(v)
			if err != nil {
				return s, err
			}
			s.UpdatedAt = t
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return s, fmt.Errorf("decode Status.ref: %w", protowire.ParseError(n))
			}
			s.Ref = v
			b = b[n:]
		case (num == 4 || num == 5) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return s, fmt.Errorf("decode Status: %w", protowire.ParseError(n))
			}
			if num == 4 {
				s.Offset = int64(v)
			} else {
				s.Total = int64(v)
			}
			b = b[n:]
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return s, fmt.Errorf("decode Status: %w", protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return s, nil
}

// decodeTimestamp reads a google.protobuf.Timestamp: seconds = 1, nanos = 2.
func decodeTimestamp(b []byte) (time.Time, error) {
	var sec, nsec int64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return time.Time{}, fmt.Errorf("decode Timestamp: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return time.Time{}, fmt.Errorf("decode Timestamp: %w", protowire.ParseError(n))
			}
			if num == 1 {
				sec = int64(v)
			} else {
				nsec = int64(v)
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return time.Time{}, fmt.Errorf("decode Timestamp: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return time.Unix(sec, nsec), nil
}

// RawCodec passes encoded messages through as bytes: the calls to
// containerd's own APIs encode their few fields by hand.
type RawCodec struct{}

func (RawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return b, nil
}

func (RawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*p = append((*p)[:0], data...)
	return nil
}

func (RawCodec) Name() string { return "proto" }
