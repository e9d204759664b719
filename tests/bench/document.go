package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// Document is a harness's report: Markdown that refers to a plot.
type Document interface {
	Markdown() string
	WritePlot(path string) error
}

// KeptMarker starts the part of a report page the harness does not write:
// from this line on, the page as it was is kept below the new report
// (docs/benchmarks.md keeps its measured figures there).
const KeptMarker = "<!-- Not written by make bench or make scale: kept from here on. -->"

// WriteDocument writes d's plot to plotFile and its Markdown to out, with
// the part of out from KeptMarker on kept.
// plotRef is the report's field that names the plot; it is set to the
// plot's path relative to out first, so that the Markdown links it.
// make bench and make scale both write their pages this way.
func WriteDocument(out, plotFile string, plotRef *string, d Document) error {
	rel, err := filepath.Rel(filepath.Dir(out), plotFile)
	if err != nil {
		rel = plotFile
	}
	*plotRef = rel
	if err := d.WritePlot(plotFile); err != nil {
		return err
	}
	md := d.Markdown()
	if old, err := os.ReadFile(out); err == nil {
		if i := strings.Index(string(old), KeptMarker); i >= 0 {
			md += "\n" + string(old[i:])
		}
	}
	if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	fmt.Printf("wrote %s and %s\n", out, plotFile)
	return nil
}

// SavePlot saves p as a PNG of w × h at path.
func SavePlot(p *plot.Plot, w, h vg.Length, path string) error {
	if err := p.Save(w, h, path); err != nil {
		return fmt.Errorf("save plot %s: %w", path, err)
	}
	return nil
}

// WriteJSON saves a report's numbers at path, so that a later run on other
// code can show them beside its own (ReadJSON, the harnesses' -before).
func WriteJSON(path string, report any) error {
	data, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// ReadJSON reads what WriteJSON saved into report.
func ReadJSON(path string, report any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, report); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}
