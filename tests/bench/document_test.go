package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type page struct{ plotFile string }

func (p *page) Markdown() string { return "![plot](" + p.plotFile + ")\n" }

func (p *page) WritePlot(path string) error { return os.WriteFile(path, []byte("png"), 0o644) }

// The page links its plot by the path relative to the page, and both
// files are written.
func TestWriteDocument(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "docs", "report.md")
	plotFile := filepath.Join(dir, "docs", "report.png")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &page{}
	if err := WriteDocument(out, plotFile, &p.plotFile, p); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out)
	if err != nil || strings.TrimSpace(string(md)) != "![plot](report.png)" {
		t.Errorf("report %q (%v), want it to link report.png", md, err)
	}
	if _, err := os.Stat(plotFile); err != nil {
		t.Errorf("plot not written: %v", err)
	}
}

// What follows KeptMarker in the page survives a new report; the old
// report above it does not.
func TestWriteDocumentKeepsMarkedPart(t *testing.T) {
	tests := []struct {
		name, old, want string
	}{
		{"no page yet", "", "![plot](report.png)\n"},
		{"no marker", "old report\n", "![plot](report.png)\n"},
		{"marker", "old report\n" + KeptMarker + "\n## Figures\n", "![plot](report.png)\n\n" + KeptMarker + "\n## Figures\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "report.md")
			if tt.old != "" {
				if err := os.WriteFile(out, []byte(tt.old), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p := &page{}
			if err := WriteDocument(out, filepath.Join(dir, "report.png"), &p.plotFile, p); err != nil {
				t.Fatal(err)
			}
			if md, err := os.ReadFile(out); err != nil || string(md) != tt.want {
				t.Errorf("page %q (%v), want %q", md, err, tt.want)
			}
		})
	}
}
