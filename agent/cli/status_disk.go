package cli

import "fmt"

func hasDisk(rows []NodeStatus) bool {
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.Summary != nil && i.Summary.Disk != nil {
				return true
			}
		}
	}
	return false
}

// diskCell shows the image filesystem's usage against the ceiling, as the
// node's agent last wrote it: "62% (ceiling 80%)", or that the ceiling
// holds nothing back because the capacity is unknown (the cause is in
// `status -o json`).
func diskCell(i InstanceStatus) string {
	if i.Summary == nil || i.Summary.Disk == nil {
		return "-"
	}
	d := i.Summary.Disk
	if d.Unknown != "" {
		return "unknown: no ceiling"
	}
	return fmt.Sprintf("%d%% (ceiling %d%%)", d.Percent(), d.CeilingPercent)
}
