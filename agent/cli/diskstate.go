package cli

import (
	"context"

	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// diskState is the image filesystem against the ceiling, for the
// annotation (status shows it); with the cause when the capacity cannot be
// read.
func (a *agent) diskState(ctx context.Context) *label.Disk {
	if a.disk == nil {
		return nil
	}
	u, err := a.disk.Usage(ctx)
	if err != nil || !u.Known() {
		why := "capacity unknown"
		if err != nil {
			why = err.Error()
		}
		return &label.Disk{CeilingPercent: a.disk.Ceiling.Percent, Unknown: label.Truncate(why)}
	}
	return &label.Disk{UsedBytes: u.UsedBytes(), CapacityBytes: u.CapacityBytes, CeilingPercent: a.disk.Ceiling.Percent}
}
