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
