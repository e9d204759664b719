package hits

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// maxMissLines bounds the misses listed under the table, per instance;
// -o json lists every pull.
const maxMissLines = 20

// WriteTable prints the view: per instance a row of totals, then one row
// per node; under the table each miss, and what was counted.
func WriteTable(out io.Writer, r Report) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "INSTANCE\tNODE\tLABEL\tHITS\tMISSES\tNOT-COUNTED")
	for _, i := range r.Instances {
		if i.Error != "" {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\n", i.Instance)
			continue
		}
		fmt.Fprintf(w, "%s\t(all)\t-\t%d\t%d\t%d\n", i.Instance, i.Hits, i.Misses, i.NotCounted)
		for _, n := range i.Nodes {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\n", i.Instance, n.Node, n.Label, n.Hits, n.Misses, n.NotCounted)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, i := range r.Instances {
		if i.Error != "" {
			fmt.Fprintf(out, "%s: no view: %s\n", i.Instance, i.Error)
			continue
		}
		listed := 0
		for _, n := range i.Nodes {
			for _, p := range n.Pulls {
				if p.Hit {
					continue
				}
				if listed++; listed > maxMissLines {
					continue
				}
				counted := ""
				if !p.Counted() {
					counted = ", not counted"
				}
				fmt.Fprintf(out, "miss: %s on %s at %s (label %s%s): pod %s pulled %s\n", i.Instance, n.Node, p.Time.UTC().Format(time.RFC3339), p.Label, counted, p.Pod, p.Image)
			}
		}
		if listed > maxMissLines {
			fmt.Fprintf(out, "miss: %s: and %d more (-o json lists every pull)\n", i.Instance, listed-maxMissLines)
		}
	}
	since := "none seen"
	if r.Since != nil {
		since = "since " + r.Since.UTC().Format(time.RFC3339)
	}
	if _, err := fmt.Fprintf(out, "Counted: containers started while the node was labeled succeeded; a hit found the image on the node, a miss pulled it (the kubelet's Events, %s; the apiserver keeps Events for its --event-ttl, 1h by default).\n", since); err != nil {
		return err
	}
	if r.Note == "" {
		return nil
	}
	_, err := fmt.Fprintf(out, "Note: %s\n", r.Note)
	return err
}
