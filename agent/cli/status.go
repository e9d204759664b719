package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InstanceStatus is one instance's state on one node.
type InstanceStatus struct {
	Instance string         `json:"instance"`
	State    string         `json:"state"`
	Summary  *label.Summary `json:"summary,omitempty"`
	// StartupTaint is set when the instance has a startup taint.
	StartupTaint *TaintState `json:"startupTaint,omitempty"`
	// Owner is the instance the key belongs to; nil for a key that names
	// no owner. See status_owner.go.
	Owner *label.Owner `json:"owner,omitempty"`
	// Conflict explains why the key is not the selected instance's, or why
	// two instances of this name hold it on different nodes.
	Conflict string `json:"conflict,omitempty"`
}

// TaintState tells whether a node still carries an instance's startup
// taint.
type TaintState struct {
	Key     string `json:"key"`
	Present bool   `json:"present"`
}

// NodeStatus is one node's row of `status -o json`.
type NodeStatus struct {
	Node      string           `json:"node"`
	Instances []InstanceStatus `json:"instances"`
}

// stateMissing is shown when a node has no label for an instance.
const stateMissing = "missing"

func newStatus(deps *Deps) *cobra.Command {
	var kubeconfig, selector, output, domain, cleanup, startupTaint, namespace string
	var instances []string
	var includeUnowned, showHits bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each node's prefetch state; exit 1 unless every selected node is succeeded",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf("-o %q: want table or json", output)}
			}
			if cleanup != "" && namespace == "" {
				return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf(
					"--cleanup needs --namespace: the key is removed only where the instance %s of that namespace owns it", cleanup)}
			}
			client, err := deps.Kube(kubeconfig)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			nodes, err := client.Nodes().List(lctx, metav1.ListOptions{LabelSelector: selector})
			cancel()
			if err != nil {
				return fmt.Errorf("list nodes: %w", err)
			}
			if cleanup != "" {
				return cleanupInstance(ctx, deps, client.Nodes(), nodes.Items, label.Key(domain, cleanup), label.NewOwner(namespace, cleanup), includeUnowned)
			}
			rows, allOK := Collect(nodes.Items, domain, instances)
			addTaints(rows, nodes.Items, startupTaint)
			if !flagConflicts(rows, namespace) {
				allOK = false
			}
			if showHits {
				ok, err := printHits(ctx, deps, client, nodes.Items, rows, domain, namespace, output)
				if err != nil {
					return err
				}
				allOK = allOK && ok
			} else if output == "json" {
				enc := json.NewEncoder(deps.Stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rows); err != nil {
					return err
				}
			} else {
				printTable(deps, rows)
			}
			if !allOK {
				return &ExitCodeError{Code: ExitError, Err: errSilent}
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "",
		"kubeconfig file (default: in a pod, its service account; else $KUBECONFIG or ~/.kube/config)")
	fs.StringVarP(&selector, "selector", "l", "", "only nodes matching this label selector")
	fs.StringArrayVar(&instances, "instance", nil, "only this instance (repeatable; default: every instance found)")
	fs.StringVarP(&output, "output", "o", "table", "table or json")
	fs.StringVar(&domain, "label-domain", v1alpha1.LabelDomain, "prefix of the node label and annotation key")
	fs.StringVar(&startupTaint, "startup-taint", "", "startup taint key to report on (default: the key each instance's agents record in their annotation)")
	fs.StringVar(&cleanup, "cleanup", "", "remove this retired instance's label and annotation from every (selected) node where it owns them (needs --namespace)")
	fs.StringVar(&namespace, "namespace", "", "the instances' namespace: a key owned by another namespace is a conflict; with --cleanup, whose keys are removed")
	fs.BoolVar(&showHits, "hits", false, "instead of the table, show whether the pods that ran each instance's images found them on the node (hits) or pulled them (misses), from the kubelet's Events of about the last hour")
	fs.BoolVar(&includeUnowned, "include-unowned", false, "with --cleanup, also remove keys that name no owner (written by a release before owners, the reference agent or by hand)")
	return cmd
}

// Collect builds the status rows. ok is false when any node lacks
// `succeeded` for any instance, or when no instance is found at all.
func Collect(nodes []corev1.Node, domain string, only []string) ([]NodeStatus, bool) {
	prefix := domain + "/"
	names := map[string]bool{}
	for _, i := range only {
		names[i] = true
	}
	if len(only) == 0 {
		for _, n := range nodes {
			for k := range n.Labels {
				if strings.HasPrefix(k, prefix) {
					names[strings.TrimPrefix(k, prefix)] = true
				}
			}
			for k := range n.Annotations {
				if strings.HasPrefix(k, prefix) {
					names[strings.TrimPrefix(k, prefix)] = true
				}
			}
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	ok := len(sorted) > 0 && len(nodes) > 0
	rows := make([]NodeStatus, 0, len(nodes))
	for _, n := range nodes {
		row := NodeStatus{Node: n.Name, Instances: []InstanceStatus{}}
		for _, inst := range sorted {
			key := prefix + inst
			st := InstanceStatus{Instance: inst, State: stateMissing}
			if v, has := n.Labels[key]; has {
				st.State = v
			}
			if a, has := n.Annotations[key]; has {
				if s, err := label.Parse(a); err == nil {
					st.Summary = &s
				}
				if o, claimed := label.Claim(a); claimed {
					st.Owner = &o
				}
			}
			if st.State != v1alpha1.LabelSucceeded {
				ok = false
			}
			row.Instances = append(row.Instances, st)
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Node < rows[j].Node })
	return rows, ok
}

func printTable(deps *Deps, rows []NodeStatus) {
	w := tabwriter.NewWriter(deps.Stdout, 0, 4, 2, ' ', 0)
	cols := []column{
		{"INSTANCE", func(i InstanceStatus) string { return i.Instance }},
		{"STATE", func(i InstanceStatus) string { return i.State }},
		{"OWNER", ownerColumn},
	}
	// Optional columns are there only when some instance has what they
	// show, so that the table of everyone else stays as it was.
	if hasTaints(rows) {
		cols = append(cols, column{"STARTUP-TAINT", func(i InstanceStatus) string { return taintCell(i.StartupTaint) }})
	}
	cols = append(cols, column{"PRESENT", presentCell})
	if hasPins(rows) {
		cols = append(cols, column{"PINNED", func(i InstanceStatus) string { return pinCell(i.Summary) }})
	}
	if hasDisk(rows) {
		cols = append(cols, column{"IMAGE-FS", diskCell})
	}
	cols = append(cols, column{"FAILURES", failuresCell})
	line := func(node string, cells func(column) string) {
		fmt.Fprint(w, node)
		for _, c := range cols {
			fmt.Fprint(w, "\t", cells(c))
		}
		fmt.Fprintln(w)
	}
	line("NODE", func(c column) string { return c.header })
	for _, r := range rows {
		if len(r.Instances) == 0 {
			line(r.Node, func(c column) string {
				if c.header == "STATE" {
					return stateMissing
				}
				return "-"
			})
		}
		for _, i := range r.Instances {
			line(r.Node, func(c column) string { return c.cell(i) })
		}
	}
	_ = w.Flush()
	printConflicts(deps, rows)
	fmt.Fprint(deps.Stdout, privateNote(rows))
	printGCHeld(deps, rows)
}

// printGCHeld says, under the table, which images the node's image GC
// keeps removing, and what would keep them.
func printGCHeld(deps *Deps, rows []NodeStatus) {
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.Summary == nil {
				continue
			}
			var held []string
			for _, f := range i.Summary.Failed {
				if f.Reason == pull.ReasonRemovedByGC {
					held = append(held, f.Image)
				}
			}
			if len(held) > 0 {
				fmt.Fprintf(deps.Stdout, "node %s, instance %s: the node's image GC keeps removing %s; not downloaded again for now (1 h, doubling). "+
					"Pinning (containerd >= 1.7.10 or 2.x, within the pin budget), a larger pin budget or the kubelet's image GC settings would keep them\n",
					r.Node, i.Instance, strings.Join(held, ", "))
			}
		}
	}
}

// column is one column of the status table after NODE.
type column struct {
	header string
	cell   func(InstanceStatus) string
}

func presentCell(i InstanceStatus) string {
	if s := i.Summary; s != nil {
		return fmt.Sprintf("%d/%d", s.Present, s.Total)
	}
	return "-"
}

func failuresCell(i InstanceStatus) string {
	s := i.Summary
	if s == nil {
		return "-"
	}
	var parts []string
	for _, f := range s.Failed {
		parts = append(parts, fmt.Sprintf("%s (%s)", f.Image, f.Reason))
	}
	if s.OmittedFailures > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", s.OmittedFailures))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
