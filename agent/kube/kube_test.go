package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// request is what the test server saw.
type request struct {
	Method, Path, Query, ContentType, Body string
	// Accept is left out of TestCalls' comparisons; TestBodies checks it.
	Accept string
}

// server answers every request with a canned status and body, and records
// the request.
type server struct {
	mu     sync.Mutex
	got    []request
	status int
	body   string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.got = append(s.got, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(b), r.Header.Get("Accept")})
	status, body := s.status, s.body
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.HasPrefix(body, "plain:") {
		w.Header().Set("Content-Type", "text/plain")
		body = strings.TrimPrefix(body, "plain:")
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

func (s *server) last(t *testing.T) request {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 {
		t.Fatal("no request reached the server")
	}
	return s.got[len(s.got)-1]
}

func newServer(t *testing.T) (*server, *rest.Config) {
	t.Helper()
	s := &server{status: http.StatusOK}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, &rest.Config{Host: hs.URL}
}

// TestCalls checks that every call the agent makes reaches the path, with
// the verb and body, that client-go's typed clients would send, and that
// the answer is decoded.
func TestCalls(t *testing.T) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "demo-slot-0", Namespace: "ns", ResourceVersion: "7"}}
	tests := []struct {
		name     string
		reply    string
		call     func(ctx context.Context, c *Client) (string, error) // returns a decoded name
		want     request
		wantName string
	}{
		{
			name:  "get node",
			reply: `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"a":"b"}}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				n, err := c.Nodes().Get(ctx, "n1", metav1.GetOptions{})
				return n.Name + "/" + n.Labels["a"], err
			},
			want:     request{Method: "GET", Path: "/api/v1/nodes/n1"},
			wantName: "n1/b",
		},
		{
			name:  "list nodes with a selector",
			reply: `{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":[{"metadata":{"name":"n1"}},{"metadata":{"name":"n2"}}]}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				l, err := c.Nodes().List(ctx, metav1.ListOptions{LabelSelector: "pool=gpu"})
				var names []string
				for _, n := range l.Items {
					names = append(names, n.Name)
				}
				return strings.Join(names, ","), err
			},
			want:     request{Method: "GET", Path: "/api/v1/nodes", Query: "labelSelector=pool%3Dgpu"},
			wantName: "n1,n2",
		},
		{
			name:  "merge patch node",
			reply: `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				n, err := c.Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(`{"metadata":{"labels":{"k":null}}}`), metav1.PatchOptions{})
				return n.Name, err
			},
			want:     request{Method: "PATCH", Path: "/api/v1/nodes/n1", ContentType: "application/merge-patch+json", Body: `{"metadata":{"labels":{"k":null}}}`},
			wantName: "n1",
		},
		{
			name:  "create event",
			reply: `{"apiVersion":"v1","kind":"Event","metadata":{"name":"pod.1","namespace":"ns"}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				e, err := c.Events("ns").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "pod."}, Reason: "Prefetched"}, metav1.CreateOptions{})
				return e.Name, err
			},
			want:     request{Method: "POST", Path: "/api/v1/namespaces/ns/events", ContentType: "application/vnd.kubernetes.protobuf"},
			wantName: "pod.1",
		},
		{
			name:  "list events of every namespace",
			reply: `{"apiVersion":"v1","kind":"EventList","metadata":{"continue":"c2"},"items":[{"metadata":{"name":"p.1","namespace":"a"},"reason":"Pulled"}]}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				l, err := c.Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=Pulled", Limit: 500, Continue: "c1"})
				return l.Items[0].Namespace + "/" + l.Items[0].Name + "@" + l.Continue, err
			},
			want:     request{Method: "GET", Path: "/api/v1/events", Query: "continue=c1&fieldSelector=reason%3DPulled&limit=500"},
			wantName: "a/p.1@c2",
		},
		{
			name:  "get configmap",
			reply: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"image-prefetcher-web.images"},"data":{"images.txt":"a:1"}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				m, err := c.ConfigMaps("ns").Get(ctx, "image-prefetcher-web.images", metav1.GetOptions{})
				return m.Name + ":" + m.Data["images.txt"], err
			},
			want:     request{Method: "GET", Path: "/api/v1/namespaces/ns/configmaps/image-prefetcher-web.images"},
			wantName: "image-prefetcher-web.images:a:1",
		},
		{
			name:  "get lease",
			reply: `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo-slot-0","resourceVersion":"7"}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				l, err := c.Leases("ns").Get(ctx, "demo-slot-0", metav1.GetOptions{})
				return l.Name + "@" + l.ResourceVersion, err
			},
			want:     request{Method: "GET", Path: "/apis/coordination.k8s.io/v1/namespaces/ns/leases/demo-slot-0"},
			wantName: "demo-slot-0@7",
		},
		{
			name:  "create lease",
			reply: `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo-slot-0","resourceVersion":"1"}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				l, err := c.Leases("ns").Create(ctx, lease, metav1.CreateOptions{})
				return l.Name + "@" + l.ResourceVersion, err
			},
			want:     request{Method: "POST", Path: "/apis/coordination.k8s.io/v1/namespaces/ns/leases", ContentType: "application/vnd.kubernetes.protobuf"},
			wantName: "demo-slot-0@1",
		},
		{
			name:  "list leases by label",
			reply: `{"apiVersion":"coordination.k8s.io/v1","kind":"LeaseList","metadata":{"resourceVersion":"42"},"items":[{"metadata":{"name":"demo-slot-0"}},{"metadata":{"name":"demo-slot-1"}}]}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				l, err := c.Leases("ns").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=demo"})
				var names []string
				for _, x := range l.Items {
					names = append(names, x.Name)
				}
				return strings.Join(names, ",") + "@" + l.ResourceVersion, err
			},
			want:     request{Method: "GET", Path: "/apis/coordination.k8s.io/v1/namespaces/ns/leases", Query: "labelSelector=app.kubernetes.io%2Finstance%3Ddemo"},
			wantName: "demo-slot-0,demo-slot-1@42",
		},
		{
			name: "watch leases",
			reply: `{"type":"ADDED","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo-slot-0","resourceVersion":"43"}}}
{"type":"MODIFIED","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo-slot-1","resourceVersion":"44"},"spec":{"holderIdentity":"pod-1"}}}
{"type":"BOOKMARK","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"resourceVersion":"50"}}}
`,
			call: func(ctx context.Context, c *Client) (string, error) {
				secs := int64(300)
				w, err := c.Leases("ns").Watch(ctx, metav1.ListOptions{LabelSelector: "a=b", ResourceVersion: "42", AllowWatchBookmarks: true, TimeoutSeconds: &secs})
				if err != nil {
					return "", err
				}
				defer w.Stop()
				var seen []string
				for ev := range w.ResultChan() {
					l, ok := ev.Object.(*coordinationv1.Lease)
					if !ok {
						return "", fmt.Errorf("event %s carries %T", ev.Type, ev.Object)
					}
					seen = append(seen, fmt.Sprintf("%s:%s@%s", ev.Type, l.Name, l.ResourceVersion))
				}
				return strings.Join(seen, ","), nil
			},
			want:     request{Method: "GET", Path: "/apis/coordination.k8s.io/v1/namespaces/ns/leases", Query: "allowWatchBookmarks=true&labelSelector=a%3Db&resourceVersion=42&timeout=5m0s&timeoutSeconds=300&watch=true"},
			wantName: "ADDED:demo-slot-0@43,MODIFIED:demo-slot-1@44,BOOKMARK:@50",
		},
		{
			name:  "update lease",
			reply: `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo-slot-0","resourceVersion":"8"}}`,
			call: func(ctx context.Context, c *Client) (string, error) {
				l, err := c.Leases("ns").Update(ctx, lease, metav1.UpdateOptions{})
				return l.Name + "@" + l.ResourceVersion, err
			},
			want:     request{Method: "PUT", Path: "/apis/coordination.k8s.io/v1/namespaces/ns/leases/demo-slot-0", ContentType: "application/vnd.kubernetes.protobuf"},
			wantName: "demo-slot-0@8",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, cfg := newServer(t)
			s.body = tt.reply
			c, err := NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			name, err := tt.call(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			if name != tt.wantName {
				t.Errorf("decoded %q, want %q", name, tt.wantName)
			}
			got := s.last(t)
			got.Accept = ""
			if tt.want.Body == "" {
				got.Body = ""
			}
			if got != tt.want {
				t.Errorf("request\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestBodies checks that objects are sent as protobuf with their kind, and
// that protobuf is asked for first: a waiting node decodes every slot event
// of its instance, and JSON decoding cost waiting agents twice the CPU.
func TestBodies(t *testing.T) {
	s, cfg := newServer(t)
	s.body = `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"x"}}`
	c, err := NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	holder := "pod-1"
	if _, err := c.Leases("ns").Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := s.last(t)
	if !strings.HasPrefix(got.Accept, "application/vnd.kubernetes.protobuf,") {
		t.Errorf("Accept %q, want protobuf first", got.Accept)
	}
	obj, gvk, err := codecs.UniversalDeserializer().Decode([]byte(got.Body), nil, nil)
	if err != nil {
		t.Fatalf("body is not a protobuf object: %v", err)
	}
	if gvk.GroupVersion() != coordinationv1.SchemeGroupVersion || gvk.Kind != "Lease" {
		t.Errorf("sent %v", gvk)
	}
	if l, ok := obj.(*coordinationv1.Lease); !ok || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
		t.Errorf("sent %#v", obj)
	}
}

// TestErrors checks that API errors come back as client-go's StatusError,
// because label.Retryable and agent/slots decide on them with apierrors.
func TestErrors(t *testing.T) {
	status := func(code int, reason metav1.StatusReason) string {
		b, _ := json.Marshal(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: "m"})
		return string(b)
	}
	tests := []struct {
		name  string
		code  int
		body  string
		check func(error) bool
	}{
		{"not found", 404, status(404, metav1.StatusReasonNotFound), apierrors.IsNotFound},
		{"conflict", 409, status(409, metav1.StatusReasonConflict), apierrors.IsConflict},
		{"already exists", 409, status(409, metav1.StatusReasonAlreadyExists), apierrors.IsAlreadyExists},
		{"forbidden", 403, status(403, metav1.StatusReasonForbidden), apierrors.IsForbidden},
		{"unauthorized without a Status body", 401, "plain:Unauthorized", apierrors.IsUnauthorized},
		{"server error without a Status body", 503, "plain:unavailable", apierrors.IsServiceUnavailable},
		{"invalid", 422, status(422, metav1.StatusReasonInvalid), apierrors.IsInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, cfg := newServer(t)
			s.status, s.body = tt.code, tt.body
			c, err := NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Leases("ns").Update(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.UpdateOptions{})
			if err == nil || !tt.check(err) {
				t.Errorf("got %T %v", err, err)
			}
		})
	}
}

// TestLeasesOverClientset checks LeasesOver on the REST client of a real
// client-go clientset, the way agent/slots uses one passed as
// Config.Leases.
func TestLeasesOverClientset(t *testing.T) {
	s, cfg := newServer(t)
	s.body = `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo-slot-1","resourceVersion":"3"}}`
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := LeasesOver(cs.CoordinationV1().RESTClient(), "ns").Get(context.Background(), "demo-slot-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != "demo-slot-1" || l.ResourceVersion != "3" {
		t.Errorf("decoded %s@%s", l.Name, l.ResourceVersion)
	}
	if got := s.last(t); got.Method != "GET" || got.Path != "/apis/coordination.k8s.io/v1/namespaces/ns/leases/demo-slot-1" {
		t.Errorf("request %+v", got)
	}
}
