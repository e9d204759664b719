package cli

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// flagConflicts marks the keys that are not what they seem and reports
// whether there were none. With namespace set, a key owned by anyone but
// the instance of that namespace is a conflict. Without it, status cannot
// tell which owner is right, so an instance name owned by two instances
// across the nodes marks every owned key of that name. A key whose owner
// cannot be read, or names another instance, is a conflict either way. So
// are keys of one instance owned by two of its copies (DaemonSets): one
// rendering applied twice under different names.
func flagConflicts(rows []NodeStatus, namespace string) bool {
	owners := map[string]map[label.Owner]bool{}
	copies := map[label.Owner]map[string]bool{}
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.Owner == nil {
				continue
			}
			if owners[i.Instance] == nil {
				owners[i.Instance] = map[label.Owner]bool{}
			}
			o := sameOwner(*i.Owner)
			owners[i.Instance][o] = true
			if i.Owner.DaemonSet != "" {
				if copies[o] == nil {
					copies[o] = map[string]bool{}
				}
				copies[o][i.Owner.DaemonSet] = true
			}
		}
	}
	ok := true
	for ri := range rows {
		for ii := range rows[ri].Instances {
			i := &rows[ri].Instances[ii]
			o := i.Owner
			switch {
			case o == nil:
				continue
			case o.Namespace == "" || o.Name == "":
				i.Conflict = "the annotation names an owner that cannot be read"
			case o.Name != i.Instance:
				i.Conflict = fmt.Sprintf("the annotation names %s, another instance, as the owner", o)
			case namespace != "" && o.Namespace != namespace:
				i.Conflict = fmt.Sprintf("owned by %s, not by %s/%s: two instances share the name %q", o, namespace, i.Instance, i.Instance)
			case namespace == "" && len(owners[i.Instance]) > 1:
				i.Conflict = fmt.Sprintf("owned by %s here and by %s elsewhere: two instances share the name %q", o, otherOwners(owners[i.Instance], *o), i.Instance)
			case o.DaemonSet != "" && len(copies[sameOwner(*o)]) > 1:
				i.Conflict = fmt.Sprintf("owned by DaemonSet %s here and by %s elsewhere: one rendering of %s applied twice under different names", o.DaemonSet, otherCopies(copies[sameOwner(*o)], o.DaemonSet), o)
			default:
				continue
			}
			ok = false
		}
	}
	return ok
}

// sameOwner keys owners by namespace and name: the ID follows from them.
func sameOwner(o label.Owner) label.Owner { return label.Owner{Namespace: o.Namespace, Name: o.Name} }

func otherOwners(set map[label.Owner]bool, o label.Owner) string {
	var names []string
	for other := range set {
		if other != sameOwner(o) {
			names = append(names, other.String())
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func otherCopies(set map[string]bool, ds string) string {
	var names []string
	for other := range set {
		if other != ds {
			names = append(names, "DaemonSet "+other)
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func ownerColumn(i InstanceStatus) string {
	col := "-"
	if i.Owner != nil {
		col = i.Owner.String()
		if i.Owner.Namespace == "" && i.Owner.Name == "" {
			col = "?"
		}
	}
	if i.Conflict != "" {
		col += " (conflict)"
	}
	return col
}

// printConflicts explains the conflicts under the table, one line per
// node and key.
func printConflicts(deps *Deps, rows []NodeStatus) {
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.Conflict != "" {
				fmt.Fprintf(deps.Stdout, "conflict on node %s, instance %s: %s\n", r.Node, i.Instance, i.Conflict)
			}
		}
	}
}

// cleanupInstance removes a retired instance's key from every node where
// that instance owns it; a key that names no owner only with
// includeUnowned. A key owned by another instance of the same name stays,
// and is listed.
func cleanupInstance(ctx context.Context, deps *Deps, client kube.NodeClient, nodes []corev1.Node, key string, owner label.Owner, includeUnowned bool) error {
	var errs []error
	removed := 0
	for _, n := range nodes {
		_, hasLabel := n.Labels[key]
		ann, hasAnn := n.Annotations[key]
		if !hasLabel && !hasAnn {
			continue
		}
		theirs, claimed := label.Claim(ann)
		switch {
		case !claimed && !includeUnowned:
			fmt.Fprintf(deps.Stdout, "kept %s on node %s: it names no owner (--include-unowned removes it)\n", key, n.Name)
			continue
		case claimed && !owner.Owns(ann):
			fmt.Fprintf(deps.Stdout, "kept %s on node %s: it belongs to %s, not to %s\n", key, n.Name, theirs, owner)
			continue
		}
		// The Labeler re-reads the key and removes it only if it is still
		// unowned or the instance's own.
		l := &label.Labeler{Nodes: client, Node: n.Name, Key: key, Owner: &owner, Sleep: deps.LabelSleep}
		if err := l.Remove(ctx, 30*time.Second); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		fmt.Fprintf(deps.Stdout, "removed %s from node %s\n", key, n.Name)
	}
	fmt.Fprintf(deps.Stdout, "%d node(s) cleaned up\n", removed)
	return errors.Join(errs...)
}
