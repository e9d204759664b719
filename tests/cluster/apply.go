package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// DryRun asks the apiserver to validate and admit without storing.
	DryRun bool
	// FieldManager defaults to "e2e".
	FieldManager string
	// Token applies as another user (a bearer token) instead of the admin.
	Token string
}

// Apply server-side applies every object of a multi-document YAML stream
// (what `kustomize build` prints), in order, and returns them as stored
// (or as they would be, with DryRun). Namespaced objects without a
// namespace go to "default". No kubectl needed.
func (c *Cluster) Apply(ctx context.Context, manifests []byte, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	cfg, err := c.RESTConfigForToken(opts.Token)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	if opts.FieldManager == "" {
		opts.FieldManager = "e2e"
	}
	objs, err := decodeYAML(manifests)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			// A CRD applied earlier in the stream is not in the cache yet.
			mapper.Reset()
			if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return out, fmt.Errorf("map %s %s: %w", gvk, obj.GetName(), err)
			}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace("default")
			}
			ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return out, fmt.Errorf("encode %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		po := metav1.PatchOptions{FieldManager: opts.FieldManager, Force: ptrTo(true)}
		if opts.DryRun {
			po.DryRun = []string{metav1.DryRunAll}
		}
		got, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, po)
		if err != nil {
			return out, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		out = append(out, got)
	}
	return out, nil
}

func decodeYAML(manifests []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("decode manifests: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "List" {
			items, _ := u.Object["items"].([]any)
			for _, it := range items {
				if im, ok := it.(map[string]any); ok {
					out = append(out, &unstructured.Unstructured{Object: im})
				}
			}
			continue
		}
		out = append(out, u)
	}
}

func ptrTo[T any](v T) *T { return &v }
