package cli

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-prefetcher/image-prefetcher/agent/hits"
	"github.com/image-prefetcher/image-prefetcher/agent/kube"
)

// printHits prints `status --hits`, the view of agent/hits, instead of the
// status table. ok is false when some instance's view could not be built.
func printHits(ctx context.Context, deps *Deps, client kube.Interface, nodes []corev1.Node, rows []NodeStatus, domain, namespace, output string) (ok bool, err error) {
	c, can := client.(hits.Client)
	if !can {
		return false, fmt.Errorf("--hits: the API client cannot read DaemonSets and ConfigMaps")
	}
	r, err := hits.Read(ctx, c, nodes, domain, hitsWanted(rows, namespace))
	if err != nil {
		return false, err
	}
	if output == "json" {
		enc := json.NewEncoder(deps.Stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = hits.WriteTable(deps.Stdout, r)
	}
	ok = true
	for _, i := range r.Instances {
		if i.Error != "" {
			ok = false
		}
	}
	return ok, err
}

// hitsWanted lists the instances of rows, each with its namespace:
// --namespace, or the one owner namespace the nodes' annotations name.
func hitsWanted(rows []NodeStatus, namespace string) []hits.Want {
	var order []string
	owners := map[string]map[string]bool{}
	for _, r := range rows {
		for _, i := range r.Instances {
			if owners[i.Instance] == nil {
				owners[i.Instance] = map[string]bool{}
				order = append(order, i.Instance)
			}
			if i.Owner != nil && i.Owner.Namespace != "" {
				owners[i.Instance][i.Owner.Namespace] = true
			}
		}
	}
	want := make([]hits.Want, 0, len(order))
	for _, name := range order {
		w := hits.Want{Instance: name, Namespace: namespace}
		if ns := owners[name]; w.Namespace == "" && len(ns) == 1 {
			for n := range ns {
				w.Namespace = n
			}
		}
		want = append(want, w)
	}
	return want
}
