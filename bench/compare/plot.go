package compare

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	colOffered = color.RGBA{R: 0xf5, G: 0x9e, B: 0x0b, A: 0xff} // amber, as sim's plots
	colRedis   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // red
	colSluice  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // blue
	colEvent   = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
	dashed     = []vg.Length{vg.Points(5), vg.Points(3)}
)

// WriteAccuracyPNG draws the surge runs: web's and mobile's offered and
// admitted rate per second under each design, against the limit.
func (r *Results) WriteAccuracyPNG(w io.Writer) error {
	s := r.Surge
	redis, sl := r.SurgeRuns[0], r.SurgeRuns[len(r.SurgeRuns)-1]
	webP, err := ratePanel(fmt.Sprintf("same surge, same offered load: web, limit %g rps (Redis token bucket: rate %g/s, burst %g)", s.Limit, s.Limit, s.Burst),
		s.Limit, redis.Web, sl.Web, nil)
	if err != nil {
		return err
	}
	mobP, err := ratePanel(fmt.Sprintf("mobile, under its limit of %g rps throughout", s.Limit), s.Limit, redis.Mobile, sl.Mobile, nil)
	if err != nil {
		return err
	}
	return drawPanels(w, []*plot.Plot{webP, mobP}, []vg.Length{3.2 * vg.Inch, 2.2 * vg.Inch})
}

// WriteOutagePNG draws the outage runs: web's admitted rate per second
// under each design while Redis or the controller is stopped.
func (r *Results) WriteOutagePNG(w io.Writer) error {
	o := r.Outage
	redis, sl := r.OutageRuns[0], r.OutageRuns[len(r.OutageRuns)-1]
	p, err := ratePanel(fmt.Sprintf("web at %.0f× its limit; Redis, or sluice's controller, stopped from t=%ds to t=%ds", o.Offered/o.Limit, o.Down, o.Up),
		o.Limit, redis.Web, sl.Web, []int{o.Down, o.Up})
	if err != nil {
		return err
	}
	return drawPanels(w, []*plot.Plot{p}, []vg.Length{3.2 * vg.Inch})
}

func ratePanel(title string, limit float64, redis, sluice []Sample, events []int) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "requests per second"
	p.X.Label.Text = "time (s)"
	p.Add(plotter.NewGrid())
	n := min(len(redis), len(sluice))
	top := limit
	for i := range n {
		top = max(top, float64(redis[i].Offered), float64(redis[i].Admitted), float64(sluice[i].Admitted))
	}
	p.Y.Min, p.Y.Max = 0, top*1.45
	p.X.Min, p.X.Max = 0, float64(n)
	for _, e := range events {
		l, err := plotter.NewLine(plotter.XYs{{X: float64(e), Y: 0}, {X: float64(e), Y: top * 1.45}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Dashes = colEvent, dashed
		p.Add(l)
	}
	series := []struct {
		name  string
		xs    []Sample
		get   func(Sample) int64
		col   color.Color
		width float64
	}{
		{"offered", redis, func(s Sample) int64 { return s.Offered }, colOffered, 1.5},
		{"admitted, Redis + Lua token bucket", redis, func(s Sample) int64 { return s.Admitted }, colRedis, 1.5},
		{"admitted, sluice", sluice, func(s Sample) int64 { return s.Admitted }, colSluice, 1.5},
	}
	for _, s := range series {
		xys := make(plotter.XYs, n)
		for i := range n {
			// Each second's count is drawn at the middle of its second.
			xys[i] = plotter.XY{X: float64(i) + 0.5, Y: float64(s.get(s.xs[i]))}
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = s.col, vg.Points(s.width)
		pts.Color, pts.Radius = s.col, vg.Points(1.5)
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	lim, err := plotter.NewLine(plotter.XYs{{X: 0, Y: limit}, {X: float64(n), Y: limit}})
	if err != nil {
		return nil, err
	}
	lim.Color, lim.Dashes = color.Black, dashed
	p.Add(lim)
	p.Legend.Add("limit", lim)
	p.Legend.Top = true
	return p, nil
}

func drawPanels(w io.Writer, panels []*plot.Plot, heights []vg.Length) error {
	const width = 11 * vg.Inch
	var height vg.Length
	for _, h := range heights {
		height += h
	}
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	y := dc.Max.Y
	for i, p := range panels {
		c := dc
		c.Max.Y = y - vg.Points(6)
		c.Min.Y = y - heights[i] + vg.Points(6)
		c.Min.X += vg.Points(6)
		c.Max.X -= vg.Points(12)
		p.Draw(c)
		y -= heights[i]
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}
