package bench

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// palette gives each configuration a color that stays apart from the
// others in print and for the common color-vision deficiencies.
var palette = []color.Color{
	color.RGBA{0x00, 0x72, 0xb2, 0xff}, // blue
	color.RGBA{0xd5, 0x5e, 0x00, 0xff}, // vermillion
	color.RGBA{0x00, 0x9e, 0x73, 0xff}, // green
	color.RGBA{0xcc, 0x79, 0xa7, 0xff}, // purple
	color.RGBA{0xe6, 0x9f, 0x00, 0xff}, // orange
	color.RGBA{0x56, 0xb4, 0xe9, 0xff}, // sky
}

// CompletionSteps turns completion times into a step curve of nodes
// labeled over time, starting at (0, 0).
func CompletionSteps(completions []float64) plotter.XYs {
	xys := plotter.XYs{{X: 0, Y: 0}}
	for i, t := range completions {
		xys = append(xys, plotter.XY{X: t, Y: float64(i)}, plotter.XY{X: t, Y: float64(i + 1)})
	}
	return xys
}

// Plot draws nodes labeled over time for every first run (empty nodes),
// with the ideal as a dashed vertical line.
func (r Report) Plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Nodes labeled over time: %d nodes, %s each, registry capped at %s",
		r.Nodes, size(r.SetBytes()), rate(float64(r.Bandwidth)))
	p.Title.TextStyle.Font.Size = vg.Points(15)
	p.X.Label.TextStyle.Font.Size = vg.Points(13)
	p.Y.Label.TextStyle.Font.Size = vg.Points(13)
	p.X.Tick.Label.Font.Size = vg.Points(11)
	p.Y.Tick.Label.Font.Size = vg.Points(11)
	p.Legend.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = "seconds since the agents started"
	p.Y.Label.Text = "nodes labeled"
	p.Y.Min, p.Y.Max = 0, float64(r.Nodes)+0.5
	p.X.Min = 0
	// Early on few nodes are done, so the top left stays free of curves.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.YOffs = -vg.Points(8)
	p.Add(plotter.NewGrid())

	maxX := 0.0
	i := 0
	for _, run := range r.Runs {
		if run.Second {
			continue
		}
		var ts []float64
		for _, d := range run.Completions {
			ts = append(ts, d.Seconds())
		}
		l, err := plotter.NewLine(CompletionSteps(ts))
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", run.Config.Name, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(2)
		p.Add(l)
		ratio := Ratio(run.Last(), r.RunIdeal(run))
		label := run.Config.Describe()
		if ratio == ratio { // not NaN
			label = fmt.Sprintf("%s: %.1f s (%.2f × ideal)", label, run.Last().Seconds(), ratio)
		}
		p.Legend.Add(label, l)
		maxX = max(maxX, run.Last().Seconds())
		i++
	}
	if ideal := Ideal(int64(r.Nodes)*r.SetBytes(), r.Bandwidth); ideal > 0 {
		s := ideal.Seconds()
		l, err := plotter.NewLine(plotter.XYs{{X: s, Y: 0}, {X: s, Y: float64(r.Nodes)}})
		if err != nil {
			return nil, fmt.Errorf("plot ideal: %w", err)
		}
		l.Color = color.Gray{0x40}
		l.Width = vg.Points(1.5)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("ideal: %.1f s (all bytes ÷ cap)", s), l)
		maxX = max(maxX, s)
	}
	p.X.Max = maxX * 1.05
	return p, nil
}

// WritePlot saves Plot as a PNG at path.
func (r Report) WritePlot(path string) error {
	p, err := r.Plot()
	if err != nil {
		return err
	}
	return SavePlot(p, 10*vg.Inch, 6*vg.Inch, path)
}
