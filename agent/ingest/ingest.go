// Package ingest reads how far a containerd runtime has got with the blobs
// it is downloading. The CRI has no such call, but containerd serves its
// own content API on the CRI socket: ListStatuses lists the ingests in
// flight (one per blob being written to the content store) with the bytes
// received so far. CRI-O serves no such API and answers Unimplemented.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Namespace is the containerd namespace the CRI plugin pulls into.
const Namespace = "k8s.io"

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
	resp, err := contentapi.NewContentClient(conn).ListStatuses(ctx, &contentapi.ListStatusesRequest{})
	if err != nil {
		switch status.Code(err) {
		case codes.Unimplemented, codes.PermissionDenied:
			return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return nil, fmt.Errorf("containerd content ListStatuses: %w", err)
	}
	out := make([]Status, 0, len(resp.GetStatuses()))
	for _, s := range resp.GetStatuses() {
		out = append(out, Status{Ref: s.GetRef(), Offset: s.GetOffset(), Total: s.GetTotal(), UpdatedAt: s.GetUpdatedAt().AsTime()})
	}
	return out, nil
}
