package label

import (
	"context"
	"crypto/sha1"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// Owner is the instance a node key belongs to. Instances of the same name
// in different namespaces share the key image-prefetcher.stackrox.io/<name>;
// the owner, recorded at the start of the key's annotation, says which of
// them may write it.
//
// ID is derived from the namespace and the name alone (see NewOwner), not
// from an object UID: an instance deleted and re-created under the same
// name in the same namespace is the same owner and takes its key back.
//
// DaemonSet tells copies of one instance apart: one rendering applied
// twice under two kustomize namePrefixes has two DaemonSets (see
// v1alpha1.DaemonSetOfPod). An owner without it (an agent of an earlier
// release, or status --cleanup) stands for every copy of the instance.
type Owner struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	DaemonSet string `json:"daemonSet,omitempty"`
	ID        string `json:"id"`
}

// idSpace is the name-based UUID namespace of owner IDs (a version 4 UUID
// drawn once for this purpose).
var idSpace = [16]byte{0x5c, 0x8e, 0x1f, 0x52, 0x3d, 0x0b, 0x4a, 0x61, 0x9f, 0x27, 0x6e, 0x44, 0xa1, 0x0d, 0x93, 0xc8}

// NewOwner returns the owner record of instance name in namespace ns. ID
// is the RFC 9562 version 5 (SHA-1, name-based) UUID of "<ns>/<name>".
func NewOwner(ns, name string) Owner {
	h := sha1.New()
	h.Write(idSpace[:])
	h.Write([]byte(ns + "/" + name))
	u := h.Sum(nil)[:16]
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	id := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	return Owner{Namespace: ns, Name: name, ID: id}
}

// AgentOwner is the owner record the agent in pod writes for instance name
// in namespace ns: the copy of the instance whose DaemonSet runs the pod.
func AgentOwner(ns, name, pod string) Owner {
	o := NewOwner(ns, name)
	o.DaemonSet = v1alpha1.DaemonSetOfPod(pod)
	return o
}

func (o Owner) String() string {
	if o.Namespace == "" && o.Name == "" {
		return "an unreadable owner"
	}
	return o.Namespace + "/" + o.Name
}

func (o Owner) instance() v1alpha1.Instance {
	return v1alpha1.Instance{Namespace: o.Namespace, Name: o.Name}
}

// Prefix is how an annotation owned by o begins: the instance's
// OwnerPrefix, or with a DaemonSet its CopyPrefix, which the admission
// policy matches too (fn/render).
func (o Owner) Prefix() string {
	if o.DaemonSet != "" {
		return o.instance().CopyPrefix(o.DaemonSet)
	}
	return o.instance().OwnerPrefix()
}

// claimed matches an annotation that names an owner. Inside a JSON string
// a '"' is always escaped, so the match is an "owner" member, never text.
var claimed = regexp.MustCompile(`"owner"\s*:`)

// Claim tells who owns a key whose annotation is ann. claimed is false for
// an annotation that names no owner (written by a release before owners,
// by the reference agent or by hand): such a key is free to adopt. A
// claimed annotation that cannot be read yields a zero Owner, which is
// nobody's.
func Claim(ann string) (o Owner, isClaimed bool) {
	if !claimed.MatchString(ann) {
		return Owner{}, false
	}
	var v struct {
		Owner *Owner `json:"owner"`
	}
	if err := json.Unmarshal([]byte(ann), &v); err == nil && v.Owner != nil {
		o = *v.Owner
	}
	return o, true
}

// Owns reports whether o may write the key whose annotation is ann: the
// annotation names no owner, or o's instance and either o's copy, no copy
// (an earlier release wrote it), or any copy when o names none. The
// admission policy decides the same way (fn/render/owner.go).
func (o Owner) Owns(ann string) bool {
	if _, isClaimed := Claim(ann); !isClaimed {
		return true
	}
	rest, ok := strings.CutPrefix(ann, o.instance().OwnerPrefix())
	if !ok {
		return false
	}
	return o.DaemonSet == "" || !strings.HasPrefix(rest, `"daemonSet":`) || strings.HasPrefix(ann, o.Prefix())
}

// OwnerConflictError is returned instead of writing or removing a key that
// belongs to another instance of the same name.
type OwnerConflictError struct {
	Node, Key string
	Ours      Owner
	Theirs    Owner
}

func (e *OwnerConflictError) Error() string {
	if e.Theirs.Namespace == e.Ours.Namespace && e.Theirs.Name == e.Ours.Name {
		return fmt.Sprintf("node %s: the key %s belongs to DaemonSet %s, another copy of this instance %s (this is DaemonSet %s): one rendering is applied twice under different names; this copy leaves the key alone (if DaemonSet %s is gone, its pods did not remove the key: remove it from node %s)",
			e.Node, e.Key, e.Theirs.DaemonSet, e.Ours.instance(), e.Ours.DaemonSet, e.Theirs.DaemonSet, e.Node)
	}
	return fmt.Sprintf("node %s: the key %s belongs to instance %s, not to this instance %s: two instances share the name %q; this one leaves the key alone",
		e.Node, e.Key, e.Theirs, e.Ours, e.Ours.Name)
}

// IsOwnerConflict reports whether err is an *OwnerConflictError.
func IsOwnerConflict(err error) bool {
	var ce *OwnerConflictError
	return errors.As(err, &ce)
}

// conflictRetries bounds the immediate re-reads when the node changed
// between reading its owner and patching it. The patch loop retries the
// last conflict after a backoff.
const conflictRetries = 3

// send makes one patch attempt. With an Owner set, it first reads the node
// and refuses a key that belongs to another instance; the patch then
// carries the resourceVersion that was read, so that a key claimed by
// someone else in between fails the patch with a conflict instead of being
// overwritten.
func (l *Labeler) send(ctx context.Context, body []byte) error {
	if l.Owner == nil {
		_, err := l.Nodes.Patch(ctx, l.Node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}
	var err error
	for range conflictRetries {
		var node *nodeMeta
		node, err = l.readKey(ctx)
		if err != nil {
			return err
		}
		if node.hasAnn && !l.Owner.Owns(node.ann) {
			theirs, _ := Claim(node.ann)
			return &OwnerConflictError{Node: l.Node, Key: l.Key, Ours: *l.Owner, Theirs: theirs}
		}
		var guarded []byte
		guarded, err = withResourceVersion(body, node.resourceVersion)
		if err != nil {
			return err
		}
		_, err = l.Nodes.Patch(ctx, l.Node, types.MergePatchType, guarded, metav1.PatchOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

type nodeMeta struct {
	resourceVersion  string
	ann              string
	hasAnn, hasLabel bool
}

func (l *Labeler) readKey(ctx context.Context) (*nodeMeta, error) {
	n, err := l.Nodes.Get(ctx, l.Node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	m := &nodeMeta{resourceVersion: n.ResourceVersion}
	m.ann, m.hasAnn = n.Annotations[l.Key]
	return m, nil
}

// withResourceVersion adds metadata.resourceVersion to a merge patch: the
// API server then applies it only to that version of the node.
func withResourceVersion(body []byte, rv string) ([]byte, error) {
	if rv == "" {
		return body, nil
	}
	var p map[string]any
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, fmt.Errorf("decode patch: %w", err)
	}
	meta, _ := p["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		p["metadata"] = meta
	}
	meta["resourceVersion"] = rv
	return json.Marshal(p)
}
