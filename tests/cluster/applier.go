package cluster

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// Applier server-side applies objects one by one with one REST mapper and
// one client, unthrottled: for tests that apply thousands of objects,
// where Apply's discovery per call would dominate. It is safe for
// concurrent use.
type Applier struct {
	opts   ApplyOptions
	dyn    dynamic.Interface
	mu     sync.Mutex
	mapper *restmapper.DeferredDiscoveryRESTMapper
	// unserved remembers kinds discovery did not know even after a reset,
	// so that each costs one rediscovery, not one per object.
	unserved map[schema.GroupVersionKind]error
}

// NewApplier returns an Applier acting as opts.Token (the admin if empty).
func (c *Cluster) NewApplier(opts ApplyOptions) (*Applier, error) {
	cfg, err := c.RESTConfigForToken(opts.Token)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	if opts.FieldManager == "" {
		opts.FieldManager = "e2e"
	}
	return &Applier{opts: opts, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), unserved: map[schema.GroupVersionKind]error{}}, nil
}

// Apply server-side applies one object (a dry run with opts.DryRun) and
// returns it as stored. A namespaced object without a namespace goes to
// "default".
func (a *Applier) Apply(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	a.mu.Lock()
	err, known := a.unserved[gvk]
	var mapping *meta.RESTMapping
	if !known {
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			a.mapper.Reset()
			if mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				a.unserved[gvk] = err
			}
		}
	}
	a.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("map %s %s: %w", gvk, obj.GetName(), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		obj = obj.DeepCopy()
		if obj.GetNamespace() == "" {
			obj.SetNamespace("default")
		}
		ri = a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	po := metav1.PatchOptions{FieldManager: a.opts.FieldManager, Force: ptrTo(true)}
	if a.opts.DryRun {
		po.DryRun = []string{metav1.DryRunAll}
	}
	got, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, po)
	if err != nil {
		return nil, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return got, nil
}

// DecodeManifests splits a multi-document YAML stream (what `kustomize
// build` prints) into objects.
func DecodeManifests(manifests []byte) ([]*unstructured.Unstructured, error) {
	return decodeYAML(manifests)
}
