package configurator

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/sluicehq/sluice/pkg/history"
)

var sparks = []rune("▁▂▃▄▅▆▇█")

// sparkline draws values as block characters, scaled from 0 to the largest
// value so that bar heights compare like the rates do. NaN (a day without
// history) is a space.
func sparkline(values []float64) string {
	top := 0.0
	for _, v := range values {
		if v > top {
			top = v
		}
	}
	var b strings.Builder
	for _, v := range values {
		switch {
		case math.IsNaN(v):
			b.WriteRune(' ')
		case !(top > 0) || !(v > 0):
			b.WriteRune(sparks[0])
		default:
			i := int(math.Ceil(v/top*float64(len(sparks)))) - 1
			b.WriteRune(sparks[min(max(i, 0), len(sparks)-1)])
		}
	}
	return b.String()
}

// dailySeries lays one bucket's daily rows out on the days [from, to), NaN
// where a day has no row.
func dailySeries(rows []history.DailyPeak, from time.Time, n int) (days []time.Time, peak, mean []float64) {
	days = make([]time.Time, n)
	peak = make([]float64, n)
	mean = make([]float64, n)
	for i := range n {
		days[i] = from.AddDate(0, 0, i)
		peak[i], mean[i] = math.NaN(), math.NaN()
	}
	for _, r := range rows {
		i := int(r.Day.Sub(from) / Day)
		if i >= 0 && i < n {
			peak[i], mean[i] = r.PeakOffered, r.MeanOffered
		}
	}
	return days, peak, mean
}

// writePNG plots daily peak and mean offered rate and, when there is one,
// the limit in force as a line.
func writePNG(w io.Writer, title string, days []time.Time, peak, mean []float64, limit *float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "day (UTC)"
	p.X.Tick.Marker = plot.TimeTicks{Format: "Jan 2"}
	p.Y.Label.Text = "offered rate (rps)"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())

	// One line per run of days with history: a gap stays a gap.
	runs := func(vs []float64) []plotter.XYs {
		var out []plotter.XYs
		var cur plotter.XYs
		for i, v := range vs {
			if math.IsNaN(v) {
				if len(cur) > 0 {
					out, cur = append(out, cur), nil
				}
				continue
			}
			cur = append(cur, plotter.XY{X: float64(days[i].Unix()), Y: v})
		}
		if len(cur) > 0 {
			out = append(out, cur)
		}
		return out
	}
	add := func(name string, rs []plotter.XYs, c color.Color, dashed bool) error {
		for i, pts := range rs {
			l, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("plot %s: %w", name, err)
			}
			l.Color = c
			l.Width = vg.Points(1.5)
			if dashed {
				l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			p.Add(l)
			if i == 0 {
				p.Legend.Add(name, l)
			}
			if !dashed {
				s, err := plotter.NewScatter(pts)
				if err != nil {
					return fmt.Errorf("plot %s: %w", name, err)
				}
				s.Color, s.Shape, s.Radius = c, draw.CircleGlyph{}, vg.Points(2)
				p.Add(s)
			}
		}
		return nil
	}
	top := 0.0
	for _, v := range peak {
		if v > top { // NaN is not
			top = v
		}
	}
	if err := add("daily peak", runs(peak), color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, false); err != nil {
		return err
	}
	if err := add("daily mean", runs(mean), color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, false); err != nil {
		return err
	}
	if limit != nil && len(days) > 0 {
		top = max(top, *limit)
		pts := plotter.XYs{{X: float64(days[0].Unix()), Y: *limit}, {X: float64(days[len(days)-1].Unix()), Y: *limit}}
		if err := add("limit "+formatRate(*limit)+" rps", []plotter.XYs{pts}, color.Black, true); err != nil {
			return err
		}
	}
	// Room above the highest line for the legend.
	p.Y.Max = max(top*1.3, 1)
	p.Legend.Left = true
	p.Legend.Top = true
	wt, err := p.WriterTo(10*vg.Inch, 4*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("render plot: %w", err)
	}
	_, err = wt.WriteTo(w)
	return err
}
