package pin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// namespace is the containerd namespace the CRI plugin keeps its images in.
const namespace = "k8s.io"

// snapshotRef labels a config blob with the snapshot its image was
// unpacked to, per snapshotter (containerd's unpacker sets it).
const snapshotRef = "containerd.io/gc.ref.snapshot."

// callTimeout bounds one call to containerd: all of them read or write
// its metadata database on the node, and one that takes longer means a
// runtime that is stuck.
const callTimeout = 10 * time.Second

// Containerd is the Store of a containerd runtime: its images, content and
// snapshots services, served on the CRI socket.
type Containerd struct {
	images    imagesapi.ImagesClient
	content   contentapi.ContentClient
	snapshots snapshotsapi.SnapshotsClient
}

// NewContainerd returns the Store served on conn, the CRI connection.
func NewContainerd(conn grpc.ClientConnInterface) *Containerd {
	return &Containerd{
		images:    imagesapi.NewImagesClient(conn),
		content:   contentapi.NewContentClient(conn),
		snapshots: snapshotsapi.NewSnapshotsClient(conn),
	}
}

func call(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", namespace)
	return context.WithTimeout(ctx, callTimeout)
}

// wrap keeps the gRPC status in the chain, and makes NotFound ErrNotFound
// and Unimplemented ErrUnsupported.
func wrap(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("%s: %w: %w", what, ErrNotFound, err)
	case codes.Unimplemented:
		return fmt.Errorf("%s: %w: %w", what, ErrUnsupported, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// List returns the image records that match a containerd filter; every
// record when filter is empty.
func (c *Containerd) List(ctx context.Context, filter string) ([]Record, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	req := &imagesapi.ListImagesRequest{}
	if filter != "" {
		req.Filters = []string{filter}
	}
	resp, err := c.images.List(ctx, req)
	if err != nil {
		return nil, wrap(err, "containerd images List %s", filter)
	}
	out := make([]Record, len(resp.GetImages()))
	for i, img := range resp.GetImages() {
		out[i] = fromProto(img)
	}
	return out, nil
}

// Get returns the image record called name.
func (c *Containerd) Get(ctx context.Context, name string) (Record, error) {
	ctx, cancel := call(ctx)
	defer cancel()
	resp, err := c.images.Get(ctx, &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		return Record{}, wrap(err, "containerd images Get %s", name)
	}
	return fromProto(resp.GetImage()), nil
}

// SetLabels sets only the given labels of the record (an empty value
// removes one), with one field path per label, so that labels others
// write meanwhile survive, and returns the record as written.
func (c *Containerd) SetLabels(ctx context.Context, r Record, labels map[string]string) (Record, error) {
	paths := make([]string, 0, len(labels))
	for k := range labels {
		paths = append(paths, "labels."+k)
	}
	// containerd reads the target even when the field paths leave it
	// alone: it is sent as it was read.
	img := &imagesapi.Image{Name: r.Name, Labels: labels, Target: &types.Descriptor{MediaType: r.Target.MediaType, Digest: r.Target.Digest, Size: r.Target.Size}}
	ctx, cancel := call(ctx)
	defer cancel()
	resp, err := c.images.Update(ctx, &imagesapi.UpdateImageRequest{Image: img, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}})
	if err != nil {
		return Record{}, wrap(err, "containerd images Update %s", r.Name)
	}
	return fromProto(resp.GetImage()), nil
}

// Unpacked returns the bytes of the snapshots an image was unpacked to:
// each layer's, from the top one down. id is the image's ID, the digest of
// its config.
func (c *Containerd) Unpacked(ctx context.Context, id string) (uint64, error) {
	cctx, cancel := call(ctx)
	info, err := c.content.Info(cctx, &contentapi.InfoRequest{Digest: id})
	cancel()
	if err != nil {
		return 0, wrap(err, "containerd content Info %s", id)
	}
	var total uint64
	for k, top := range info.GetInfo().GetLabels() {
		sn, ok := strings.CutPrefix(k, snapshotRef)
		if !ok {
			continue
		}
		n, err := c.chain(ctx, sn, top)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// chain adds up the usage of a snapshot and its parents.
func (c *Containerd) chain(ctx context.Context, snapshotter, key string) (uint64, error) {
	var total uint64
	for key != "" {
		cctx, cancel := call(ctx)
		u, err := c.snapshots.Usage(cctx, &snapshotsapi.UsageRequest{Snapshotter: snapshotter, Key: key})
		if err != nil {
			cancel()
			return 0, wrap(err, "containerd snapshots Usage %s %s", snapshotter, key)
		}
		st, err := c.snapshots.Stat(cctx, &snapshotsapi.StatSnapshotRequest{Snapshotter: snapshotter, Key: key})
		cancel()
		if err != nil {
			return 0, wrap(err, "containerd snapshots Stat %s %s", snapshotter, key)
		}
		total += uint64(max(u.GetSize(), 0))
		key = st.GetInfo().GetParent()
	}
	return total, nil
}

func fromProto(img *imagesapi.Image) Record {
	t := img.GetTarget()
	return Record{
		Name:   img.GetName(),
		Labels: img.GetLabels(),
		Target: Descriptor{MediaType: t.GetMediaType(), Digest: t.GetDigest(), Size: t.GetSize()},
	}
}

// ErrNotFound is returned for a record that does not exist.
var ErrNotFound = errors.New("not found")

// ErrUnsupported is returned when the runtime serves no images API (CRI-O).
var ErrUnsupported = errors.New("the runtime serves no containerd images API")
