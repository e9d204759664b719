package cli

import (
	"fmt"
	"strings"

	"github.com/image-prefetcher/image-prefetcher/agent/disk"
	"github.com/image-prefetcher/image-prefetcher/agent/label"
)

// hasPins reports whether any instance's summary reports pins.
func hasPins(rows []NodeStatus) bool {
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.Summary != nil && i.Summary.Pins != nil {
				return true
			}
		}
	}
	return false
}

// pinCell reads "3, 1.2 GiB of 4.0 GiB": images pinned and the bytes they
// take against the budget, then the images left unpinned.
func pinCell(s *label.Summary) string {
	if s == nil || s.Pins == nil {
		return "-"
	}
	p := s.Pins
	if p.Unsupported != "" {
		return "pinning unsupported"
	}
	if p.Error != "" && p.BudgetBytes == 0 && p.Images == 0 {
		// Nothing was counted (the budget is unknown, say): no figures.
		return "none: " + shortCause(p.Error)
	}
	if p.Error != "" && p.BudgetBytes == 0 {
		// The budget is unknown; the pins kept are counted.
		return fmt.Sprintf("%d, %s, error: %s", p.Images, disk.Bytes(p.Bytes), shortCause(p.Error))
	}
	cell := fmt.Sprintf("%d, %s of %s", p.Images, disk.Bytes(p.Bytes), disk.Bytes(p.BudgetBytes))
	if n := len(p.NotPinned) + p.OmittedNotPinned; n > 0 {
		cell += fmt.Sprintf(", %d not pinned", n)
		if len(p.NotPinned) > 0 {
			cell += " (" + p.NotPinned[0].Reason + ")"
		}
	}
	if p.Error != "" {
		cell += ", error: " + shortCause(p.Error)
	}
	return cell
}

// shortCause is the first clause of an agent's message, for a table cell;
// `status -o json` has the whole message.
func shortCause(msg string) string {
	const most = 48
	if i := strings.Index(msg, ": "); i > 0 && len(msg) > most {
		msg = msg[:i]
	}
	if r := []rune(msg); len(r) > most {
		msg = string(r[:most-1]) + "…"
	}
	return msg
}
