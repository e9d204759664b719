// Package kube is the agent's Kubernetes API client. It covers exactly the
// calls the agent makes: get, list and patch Nodes, create Events, and get,
// list, watch, create and update Leases; and those `status --hits` makes
// with the user's credentials: list Events, list DaemonSets and get a
// ConfigMap.
//
// It exists to keep the binary small. client-go's typed clientset pulls in
// k8s.io/client-go/kubernetes/scheme, whose initialisation registers every
// API group of Kubernetes; that alone costs the resident set of an idle
// agent more than 10 MiB of touched binary pages. This client is built on
// k8s.io/client-go/rest (so authentication, TLS, client-side rate limiting,
// Retry-After handling and API error decoding are client-go's own) with a
// scheme that knows only core/v1 and coordination.k8s.io/v1.
//
// The interfaces below use the method signatures of client-go's typed
// clients, so that clientset.CoreV1().Nodes() and the fake clientset's
// clients satisfy them as they are; see agent/kube/clientset for an adapter
// of a whole clientset.
package kube

import (
	"context"
	"fmt"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Interface is what the agent asks of the API server.
type Interface interface {
	Nodes() NodeClient
	Events(namespace string) EventClient
	Leases(namespace string) LeaseClient
}

// NodeClient reads and patches Nodes.
type NodeClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error)
}

// EventClient creates Events in one namespace, and lists them (in every
// namespace for the namespace "").
type EventClient interface {
	Create(ctx context.Context, event *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.EventList, error)
}

// ConfigMapClient reads ConfigMaps of one namespace.
type ConfigMapClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
}

// ConfigMapGetter is implemented by clients that can read ConfigMaps; only
// `status --hits` does, to read an instance's image list.
type ConfigMapGetter interface {
	ConfigMaps(namespace string) ConfigMapClient
}

// LeaseClient reads and writes Leases in one namespace.
type LeaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// scheme knows the few kinds the agent sends and receives, plus the
// metav1 option and status types of their group versions. Registering only
// these, rather than calling corev1.AddToScheme, spares start-up the
// reflection over every core/v1 type.
var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	scheme.AddKnownTypes(corev1.SchemeGroupVersion, &corev1.Node{}, &corev1.NodeList{}, &corev1.Event{}, &corev1.EventList{}, &corev1.ConfigMap{})
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	scheme.AddKnownTypes(coordinationv1.SchemeGroupVersion, &coordinationv1.Lease{}, &coordinationv1.LeaseList{})
	metav1.AddToGroupVersion(scheme, coordinationv1.SchemeGroupVersion)
}

// Client implements Interface over HTTP.
type Client struct {
	core         rest.Interface
	coordination rest.Interface
	apps         rest.Interface
	// cfg is kept for the kubelet stats reader (stats.go).
	cfg *rest.Config
}

var (
	_ Interface       = (*Client)(nil)
	_ DaemonSetGetter = (*Client)(nil)
	_ ConfigMapGetter = (*Client)(nil)
)

// NewForConfig builds a client. Both API groups share one HTTP client, as
// they do in client-go's clientset.
func NewForConfig(cfg *rest.Config) (*Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes HTTP client: %w", err)
	}
	core, err := restClient(cfg, hc, "/api", corev1.SchemeGroupVersion, true)
	if err != nil {
		return nil, err
	}
	coord, err := restClient(cfg, hc, "/apis", coordinationv1.SchemeGroupVersion, true)
	if err != nil {
		return nil, err
	}
	// JSON: the DaemonSet is decoded by hand into a few of its fields
	// (daemonsets.go), without the apps/v1 types protobuf would need.
	apps, err := restClient(cfg, hc, "/apis", appsV1, false)
	if err != nil {
		return nil, err
	}
	return &Client{core: core, coordination: coord, apps: apps, cfg: cfg}, nil
}

func restClient(base *rest.Config, hc *http.Client, apiPath string, gv schema.GroupVersion, protobuf bool) (*rest.RESTClient, error) {
	cfg := rest.CopyConfig(base)
	cfg.APIPath = apiPath
	cfg.GroupVersion = &gv
	cfg.NegotiatedSerializer = codecs.WithoutConversion()
	if protobuf {
		// Protobuf, as kubelets talk: a waiting node decodes every slot
		// Lease event it watches, and in JSON that decoding was two
		// thirds of a waiting agent's CPU (make scale, 1,000 nodes).
		cfg.ContentType = runtime.ContentTypeProtobuf
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	} else {
		cfg.ContentType = runtime.ContentTypeJSON
		cfg.AcceptContentTypes = runtime.ContentTypeJSON
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	c, err := rest.RESTClientForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes REST client for %s: %w", gv, err)
	}
	return c, nil
}

// Config loads the client configuration: the kubeconfig file when one is
// given, otherwise the in-cluster config, otherwise the default loading
// rules ($KUBECONFIG, ~/.kube/config).
func Config(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	}
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// Nodes returns the Node client.
func (c *Client) Nodes() NodeClient { return nodes{c.core} }

// Events returns the Event client of a namespace.
func (c *Client) Events(namespace string) EventClient {
	return events{c: c.core, ns: namespace}
}

// Leases returns the Lease client of a namespace.
func (c *Client) Leases(namespace string) LeaseClient {
	return leases{c: c.coordination, ns: namespace}
}

type nodes struct{ c rest.Interface }

func (n nodes) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := n.c.Get().Resource("nodes").Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

func (n nodes) List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	out := &corev1.NodeList{}
	err := n.c.Get().Resource("nodes").VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

func (n nodes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := n.c.Patch(pt).Resource("nodes").Name(name).SubResource(subresources...).
		VersionedParams(&opts, parameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

type events struct {
	c  rest.Interface
	ns string
}

func (e events) Create(ctx context.Context, event *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := e.c.Post().Namespace(e.ns).Resource("events").VersionedParams(&opts, parameterCodec).Body(event).Do(ctx).Into(out)
	return out, err
}

func (e events) List(ctx context.Context, opts metav1.ListOptions) (*corev1.EventList, error) {
	out := &corev1.EventList{}
	err := e.c.Get().Namespace(e.ns).Resource("events").VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

// ConfigMaps returns the ConfigMap client of a namespace.
func (c *Client) ConfigMaps(namespace string) ConfigMapClient {
	return configMaps{c: c.core, ns: namespace}
}

type configMaps struct {
	c  rest.Interface
	ns string
}

func (m configMaps) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error) {
	out := &corev1.ConfigMap{}
	err := m.c.Get().Namespace(m.ns).Resource("configmaps").Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

type leases struct {
	c  rest.Interface
	ns string
}

func (l leases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := l.c.Get().Namespace(l.ns).Resource("leases").Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

func (l leases) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	out := &coordinationv1.LeaseList{}
	err := l.c.Get().Namespace(l.ns).Resource("leases").VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

// Watch is client-go's typed Watch: the server ends the watch after
// opts.TimeoutSeconds, and the client waits that long for it.
func (l leases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	opts.Watch = true
	return l.c.Get().Namespace(l.ns).Resource("leases").VersionedParams(&opts, parameterCodec).Timeout(timeout).Watch(ctx)
}

func (l leases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := l.c.Post().Namespace(l.ns).Resource("leases").VersionedParams(&opts, parameterCodec).Body(lease).Do(ctx).Into(out)
	return out, err
}

func (l leases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := l.c.Put().Namespace(l.ns).Resource("leases").Name(lease.Name).VersionedParams(&opts, parameterCodec).Body(lease).Do(ctx).Into(out)
	return out, err
}

func (l leases) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return l.c.Delete().Namespace(l.ns).Resource("leases").Name(name).Body(&opts).Do(ctx).Error()
}

// LeasesOver returns a Lease client of a namespace that talks through c, a
// REST client of coordination.k8s.io/v1 such as the one behind client-go's
// clientset.CoordinationV1(). Requests and responses are encoded by c's own
// serializer.
func LeasesOver(c rest.Interface, namespace string) LeaseClient {
	return leases{c: c, ns: namespace}
}
