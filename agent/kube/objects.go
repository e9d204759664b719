package kube

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ObjectClient reads the metadata of, and merge-patches, objects of any
// kind by their API path (v1alpha1.HeldObject.Path): the agent holds the
// ServiceAccount and RBAC objects of its instance with a finalizer
// (agent/hold), and needs nothing else of them.
type ObjectClient interface {
	Meta(ctx context.Context, path string) (*metav1.ObjectMeta, error)
	MergePatch(ctx context.Context, path string, patch []byte) error
}

// ObjectGetter is implemented by clients that read and patch objects by
// path. It is kept apart from Interface so that clients of the other calls
// need not.
type ObjectGetter interface {
	Objects() ObjectClient
}

var _ ObjectGetter = (*Client)(nil)

// Objects returns the client of objects by path. It talks JSON: only the
// metadata is decoded.
func (c *Client) Objects() ObjectClient { return objects{c} }

type objects struct{ c *Client }

func (o objects) Meta(ctx context.Context, path string) (*metav1.ObjectMeta, error) {
	raw, err := o.c.apps.Get().AbsPath(path).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return &obj.Metadata, nil
}

func (o objects) MergePatch(ctx context.Context, path string, patch []byte) error {
	return o.c.apps.Patch(types.MergePatchType).AbsPath(path).Body(patch).Do(ctx).Error()
}
