package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// Document is a harness's report: Markdown that refers to a plot.
type Document interface {
	Markdown() string
	WritePlot(path string) error
}

// WriteDocument writes d's plot to plotFile and its Markdown to out.
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
	if err := os.WriteFile(out, []byte(d.Markdown()), 0o644); err != nil {
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
