package sim

import (
	"cmp"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	colOffered  = color.RGBA{R: 0xf5, G: 0x9e, B: 0x0b, A: 0xff} // amber
	colAdmitted = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // blue
	colAllowed  = color.Black
	colEvent    = color.RGBA{R: 0xb9, G: 0x1c, B: 0x1c, A: 0xff} // dark red
	palette     = []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
		color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
		color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
		color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	}
	dashed = []vg.Length{vg.Points(5), vg.Points(3)}
	dotted = []vg.Length{vg.Points(1.5), vg.Points(2.5)}
)

// WritePNG draws r: one panel per caller with its offered, admitted and
// allowed rate over time; a panel with every caller's drop ratio; and, when
// a caller went over its limit, a zoom on its first episode in 100 ms bins
// with the instants each stage of the loop caught up (see Pipeline). The
// failures of the timeline are marked on every panel. The title names the
// scenario and the seed. Callers whose flows all carry a criticality are
// drawn per tier instead (tierPanels), their drop ratios per caller and
// tier, and have no zoom: see Result.TieredBucket.
func WritePNG(w io.Writer, r *Result) error {
	sc := r.Scenario
	unit, unitName := timeUnit(sc.Duration)
	xlabel := "time (" + unitName + ")"

	var rows [][]*plot.Plot
	ymaxRate := func(series ...[]float64) float64 {
		top := 1.0
		for _, s := range series {
			for _, v := range s {
				if !math.IsInf(v, 0) {
					top = max(top, v)
				}
			}
		}
		return top
	}
	tiered := make([]bool, len(r.Buckets))
	for i := range r.Buckets {
		tiered[i] = r.TieredBucket(i)
	}
	for i := range r.Buckets {
		if tiered[i] {
			continue
		}
		b := &r.Buckets[i]
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s ← %s: offered, admitted and allowed rate (limit %s rps)", b.Callee, b.Bucket().Leaf(), rate(b.Limit))
		if len(rows) == 0 {
			p.Title.Text = fmt.Sprintf("%s · seed %d\n%s", sc.Name, r.Seed, p.Title.Text)
		}
		p.Y.Label.Text = "rps"
		p.X.Label.Text = xlabel
		p.Y.Tick.Marker, p.X.Tick.Marker = compactTicks, timeTicks
		p.Add(plotter.NewGrid())
		top := ymaxRate(b.Offered, b.Admitted, b.Allowed)
		p.Y.Min, p.Y.Max = 0, top*1.7
		p.X.Min, p.X.Max = 0, sc.Duration.Seconds()/unit
		if err := addSeries(p, "offered", binXYs(b.Offered, unit), colOffered, 1.5, nil); err != nil {
			return err
		}
		if err := addSeries(p, "admitted", binXYs(b.Admitted, unit), colAdmitted, 1.5, nil); err != nil {
			return err
		}
		if err := addSeries(p, "allowed", binXYs(b.Allowed, unit), colAllowed, 1, dashed); err != nil {
			return err
		}
		// The loop's happenings are labelled on the first panel, a
		// callee's on its own first one.
		first := len(rows) == 0
		label := func(h Happening) bool {
			if h.Callee == "" {
				return first
			}
			return h.Callee == b.Callee && (first || r.Buckets[i-1].Callee != b.Callee)
		}
		if err := addEvents(p, r.Timeline, unit, p.Y.Max, label); err != nil {
			return err
		}
		p.Legend.Top = true
		rows = append(rows, []*plot.Plot{p})
	}
	tierRows, err := tierPanels(r, unit, xlabel, len(rows) == 0)
	if err != nil {
		return err
	}
	rows = append(rows, tierRows...)
	capRows, err := capacityPanels(r, unit, xlabel, len(rows) == 0)
	if err != nil {
		return err
	}
	rows = append(rows, capRows...)

	// Drop ratios.
	p := plot.New()
	p.Title.Text = "drop ratio held by the sidecars (mean over the callee's sidecars, end of each second)"
	for _, x := range r.Expiries {
		if x.FailMode == "local" {
			p.Title.Text += "; 0 where a token bucket decides (an expired policy, fail mode local)"
			break
		}
	}
	// A caller of several callees is named with its callee, else by itself
	// (with its procedure, for a leaf).
	seen := map[string]map[string]bool{}
	for _, b := range r.Buckets {
		if seen[b.Caller] == nil {
			seen[b.Caller] = map[string]bool{}
		}
		seen[b.Caller][b.Callee] = true
	}
	p.Y.Label.Text = "drop ratio"
	p.X.Label.Text = xlabel
	p.Y.Tick.Marker, p.X.Tick.Marker = compactTicks, timeTicks
	p.Add(plotter.NewGrid())
	p.Y.Min, p.Y.Max = 0, 1.3
	p.X.Min, p.X.Max = 0, sc.Duration.Seconds()/unit
	for i := range r.Buckets {
		if tiered[i] {
			continue
		}
		b := &r.Buckets[i]
		name := b.Bucket().Leaf()
		if len(seen[b.Caller]) > 1 {
			name = b.Bucket().String()
		}
		if err := addSeries(p, name, binXYs(b.Ratio, unit), palette[i%len(palette)], 1.5, nil); err != nil {
			return err
		}
	}
	if slices.Contains(tiered, true) {
		if err := addTierRatios(p, r, unit, seen); err != nil {
			return err
		}
	}
	if err := addEvents(p, r.Timeline, unit, p.Y.Max, func(Happening) bool { return false }); err != nil {
		return err
	}
	p.Legend.Top = true
	rows = append(rows, []*plot.Plot{p})

	var zoom *plot.Plot
	if len(r.Pipelines) > 0 {
		if zoom, err = zoomPlot(r, &r.Pipelines[0]); err != nil {
			return err
		}
	}

	const width = 11 * vg.Inch
	panelH := 2.3 * vg.Inch
	if slices.Contains(tiered, true) {
		panelH = 2.6 * vg.Inch // room for a tier's callers in its legend
	}
	zoomH := vg.Length(0)
	if zoom != nil {
		zoomH = 3 * vg.Inch
	}
	height := panelH*vg.Length(len(rows)) + zoomH
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	top := dc
	top.Min.Y = dc.Min.Y + zoomH
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(14)}
	canvases := plot.Align(rows, tiles, top)
	for i := range rows {
		rows[i][0].Draw(canvases[i][0])
	}
	if zoom != nil {
		bottom := dc
		bottom.Max.Y = dc.Min.Y + zoomH
		bottom.Min.X += vg.Points(6)
		bottom.Max.X -= vg.Points(12)
		bottom.Min.Y += vg.Points(6)
		bottom.Max.Y -= vg.Points(8)
		zoom.Draw(bottom)
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// tierKey is a tiered callee's tier.
type tierKey struct {
	callee string
	tier   criticality.Tier
}

// tierPanels draws, per tiered callee and per tier present, the tier's
// offered and admitted rates and what the law allows it (ExpectFlows),
// summed over the flows of buckets that are wholly tiered; a tier of
// several callers shows each caller's admitted and allowed rate too. The
// panels of a callee share their y scale, so that tiers compare at a
// glance. first says the panels open the figure (its title, the loop's
// labels).
func tierPanels(r *Result, unit float64, xlabel string, first bool) ([][]*plot.Plot, error) {
	sc := r.Scenario
	var keys []tierKey
	flowsOf := map[tierKey][]int{}
	callerTiered := map[Bucket]bool{}
	for i := range r.Buckets {
		if r.TieredBucket(i) {
			callerTiered[r.Buckets[i].Bucket()] = true
		}
	}
	for j, fs := range r.Flows {
		if !callerTiered[sc.Flows[fs.Flow].Bucket()] {
			continue
		}
		k := tierKey{fs.Callee, fs.Tier}
		if flowsOf[k] == nil {
			keys = append(keys, k)
		}
		flowsOf[k] = append(flowsOf[k], j)
	}
	slices.SortStableFunc(keys, func(a, b tierKey) int {
		return cmp.Or(strings.Compare(a.callee, b.callee), cmp.Compare(a.tier, b.tier))
	})
	type sums struct {
		offered, admitted, allowed []float64
		callers                    []string
		admittedBy, allowedBy      map[string][]float64
	}
	add := func(dst *[]float64, src []float64) {
		if *dst == nil {
			*dst = make([]float64, len(src))
		}
		for i, v := range src {
			(*dst)[i] += v
		}
	}
	all := make([]sums, len(keys))
	top := map[string]float64{}
	for ki, k := range keys {
		t := &all[ki]
		t.admittedBy, t.allowedBy = map[string][]float64{}, map[string][]float64{}
		for _, j := range flowsOf[k] {
			fs := &r.Flows[j]
			add(&t.offered, fs.Offered)
			add(&t.admitted, fs.Admitted)
			add(&t.allowed, fs.Allowed)
			name := Bucket{Caller: fs.Caller, Procedure: sc.Flows[fs.Flow].Leaf}.Leaf()
			if t.admittedBy[name] == nil {
				t.callers = append(t.callers, name)
			}
			a, l := t.admittedBy[name], t.allowedBy[name]
			add(&a, fs.Admitted)
			add(&l, fs.Allowed)
			t.admittedBy[name], t.allowedBy[name] = a, l
		}
		for _, s := range [][]float64{t.offered, t.admitted, t.allowed} {
			for _, v := range s {
				if !math.IsInf(v, 0) {
					top[k.callee] = max(top[k.callee], v)
				}
			}
		}
	}
	var rows [][]*plot.Plot
	labelled := map[string]bool{}
	for ki, k := range keys {
		t := &all[ki]
		tier := k.tier.String()
		if k.tier == criticality.None {
			tier = "untiered"
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s · %s (%s): offered, admitted and what the law allows, summed over its callers",
			k.callee, tier, strings.Join(t.callers, ", "))
		if len(t.callers) == 1 {
			p.Title.Text = fmt.Sprintf("%s · %s (%s): offered, admitted and what the law allows", k.callee, tier, t.callers[0])
		}
		if first && len(rows) == 0 {
			p.Title.Text = fmt.Sprintf("%s · seed %d\n%s", sc.Name, r.Seed, p.Title.Text)
		}
		p.Y.Label.Text = "rps"
		p.X.Label.Text = xlabel
		p.Y.Tick.Marker, p.X.Tick.Marker = compactTicks, timeTicks
		p.Add(plotter.NewGrid())
		p.Y.Min, p.Y.Max = 0, max(top[k.callee], 1)*1.6
		p.X.Min, p.X.Max = 0, sc.Duration.Seconds()/unit
		if err := addSeries(p, "offered", binXYs(t.offered, unit), colOffered, 1.5, nil); err != nil {
			return nil, err
		}
		if err := addSeries(p, "admitted", binXYs(t.admitted, unit), colAdmitted, 1.5, nil); err != nil {
			return nil, err
		}
		if err := addSeries(p, "allowed", binXYs(t.allowed, unit), colAllowed, 1, dashed); err != nil {
			return nil, err
		}
		if len(t.callers) > 1 {
			for ci, name := range t.callers {
				c := callerColors[ci%len(callerColors)]
				if err := addSeries(p, name+" (dashed: allowed)", binXYs(t.admittedBy[name], unit), c, 1, nil); err != nil {
					return nil, err
				}
				if err := addSeries(p, "", binXYs(t.allowedBy[name], unit), c, 1, dashed); err != nil {
					return nil, err
				}
			}
		}
		firstRow := first && len(rows) == 0
		mine := !labelled[k.callee]
		labelled[k.callee] = true
		label := func(h Happening) bool {
			if h.Callee == "" {
				return firstRow
			}
			return h.Callee == k.callee && mine
		}
		if err := addEvents(p, r.Timeline, unit, p.Y.Max, label); err != nil {
			return nil, err
		}
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(9)
		rows = append(rows, []*plot.Plot{p})
	}
	return rows, nil
}

// callerColors tell a tier's callers apart, away from the offered,
// admitted and allowed colours.
var callerColors = []color.Color{
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// tierColors colour the drop ratio of a tier: the tiers' own, so that the
// callers of one tier share a colour.
var tierColors = [...]color.Color{
	criticality.None:          color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	criticality.CriticalPlus:  color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	criticality.Critical:      color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	criticality.SheddablePlus: color.RGBA{R: 0xf5, G: 0x9e, B: 0x0b, A: 0xff},
	criticality.Sheddable:     color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// addTierRatios draws the drop ratio the sidecars held per (caller, tier)
// of the wholly tiered buckets: a colour per tier, a dash per caller.
func addTierRatios(p *plot.Plot, r *Result, unit float64, seen map[string]map[string]bool) error {
	sc := r.Scenario
	type key struct {
		b    Bucket
		tier criticality.Tier
	}
	var keys []key
	ratio := map[key][]float64{}
	var callers []string
	for i := range r.Buckets {
		if !r.TieredBucket(i) {
			continue
		}
		b := r.Buckets[i].Bucket()
		for _, fs := range r.Flows {
			if sc.Flows[fs.Flow].Bucket() != b {
				continue
			}
			k := key{b, fs.Tier}
			if _, ok := ratio[k]; !ok {
				keys = append(keys, k)
				ratio[k] = fs.Ratio // flows of one leaf share its ratio
			}
			if !slices.Contains(callers, b.Caller) {
				callers = append(callers, b.Caller)
			}
		}
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		return cmp.Or(strings.Compare(a.b.Callee, b.b.Callee), cmp.Compare(a.tier, b.tier), compareBuckets(a.b, b.b))
	})
	styles := [][]vg.Length{nil, dashed, dotted}
	for _, k := range keys {
		name := k.b.Leaf()
		if len(seen[k.b.Caller]) > 1 {
			name = k.b.String()
		}
		tier := k.tier.String()
		if k.tier == criticality.None {
			tier = "untiered"
		}
		dash := styles[slices.Index(callers, k.b.Caller)%len(styles)]
		if err := addSeries(p, name+" · "+tier, binXYs(ratio[k], unit), tierColors[k.tier], 1.5, dash); err != nil {
			return err
		}
	}
	// Room above 1 for the legend, ticks up to 1 only.
	p.Y.Max = 1 + 0.17*float64(len(keys))
	if p.Y.Max < 1.3 {
		p.Y.Max = 1.3
	}
	p.Y.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		return compactTicks.Ticks(lo, min(hi, 1))
	})
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Title.Text = strings.Replace(p.Title.Text, "drop ratio held by the sidecars (", "drop ratio held by the sidecars per caller and tier (LeafTierRatio, ", 1)
	return nil
}

// zoomPlot draws the first seconds of an over-limit episode in fine bins
// with the pipeline's instants.
func zoomPlot(r *Result, pp *Pipeline) (*plot.Plot, error) {
	z := pp.Zoom
	p := plot.New()
	p.Title.Text = fmt.Sprintf("where the time to enforce goes: %s ← %s around its surge, in %v bins; each line marks when a stage of the loop caught up",
		pp.Bucket.Callee, pp.Bucket.Leaf(), z.Bin)
	p.Y.Label.Text = "rps"
	p.X.Label.Text = "time (s)"
	p.Y.Tick.Marker = compactTicks
	p.X.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ticks []plot.Tick
		for v := math.Ceil(lo*2) / 2; v <= hi+1e-9; v += 0.5 {
			t := plot.Tick{Value: v}
			if v == math.Trunc(v) {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			ticks = append(ticks, t)
		}
		return ticks
	})
	p.Add(plotter.NewGrid())
	xys := func(vs []float64) plotter.XYs {
		out := make(plotter.XYs, len(vs))
		for i, v := range vs {
			out[i] = plotter.XY{X: (z.Start + time.Duration(i)*z.Bin + z.Bin/2).Seconds(), Y: v}
		}
		return out
	}
	top := 1.0
	for _, v := range z.Offered {
		top = max(top, v)
	}
	p.Y.Min, p.Y.Max = 0, top*1.5
	p.X.Min = z.Start.Seconds()
	p.X.Max = (z.Start + time.Duration(len(z.Offered))*z.Bin).Seconds()
	if err := addSeries(p, "offered", xys(z.Offered), colOffered, 1.5, nil); err != nil {
		return nil, err
	}
	if err := addSeries(p, "admitted", xys(z.Admitted), colAdmitted, 1.5, nil); err != nil {
		return nil, err
	}
	if err := addSeries(p, "allowed", xys(z.Allowed), colAllowed, 1, dashed); err != nil {
		return nil, err
	}
	marks := []struct {
		t    time.Duration
		name string
	}{
		{pp.Onset, "onset"},
		{firstPartial(pp), "first ratio (partial)"},
		{pp.Reported, "reports held ≥ 95%"},
		{pp.Flushed, "zone loads held ≥ 95%"},
		{pp.Published, "tick publishes ratio"},
		{pp.Applied, "sidecars apply it"},
	}
	var lx plotter.XYs
	var ls []string
	for i, m := range marks {
		if m.t < 0 {
			continue
		}
		x := m.t.Seconds()
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
		if err != nil {
			return nil, err
		}
		l.Color = colEvent
		l.Dashes = dotted
		p.Add(l)
		// Staggered so that close instants do not print over each other.
		lx = append(lx, plotter.XY{X: x, Y: p.Y.Max * (0.95 - 0.07*float64(i))})
		ls = append(ls, fmt.Sprintf(" %s %s", m.name, dur(m.t)))
	}
	if len(lx) > 0 {
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: lx, Labels: ls})
		if err != nil {
			return nil, err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].Color = colEvent
			labels.TextStyle[i].Font.Size = vg.Points(9)
		}
		p.Add(labels)
	}
	p.Legend.Top, p.Legend.Left = true, false
	return p, nil
}

// firstPartial is the first publication when it came before the accurate
// one, else -1.
func firstPartial(pp *Pipeline) time.Duration {
	if pp.FirstPublished >= 0 && pp.FirstPublished < pp.Published {
		return pp.FirstPublished
	}
	return -1
}

func addSeries(p *plot.Plot, name string, xys plotter.XYs, c color.Color, width float64, dashes []vg.Length) error {
	// Unbounded stretches (an allowed rate of +Inf) are left out.
	var runs []plotter.XYs
	var cur plotter.XYs
	for _, xy := range xys {
		if math.IsInf(xy.Y, 0) || math.IsNaN(xy.Y) {
			if len(cur) > 0 {
				runs, cur = append(runs, cur), nil
			}
			continue
		}
		cur = append(cur, xy)
	}
	if len(cur) > 0 {
		runs = append(runs, cur)
	}
	for i, run := range runs {
		l, err := plotter.NewLine(run)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		l.Color = c
		l.Width = vg.Points(width)
		l.Dashes = dashes
		p.Add(l)
		if i == 0 && name != "" { // "": no legend entry
			p.Legend.Add(name, l)
		}
	}
	return nil
}

// addEvents marks the timeline's happenings as vertical lines, and labels
// those label says. Labels stagger over four heights, so that close instants
// do not print over each other, and those in the last third of the plot end
// at their line rather than start there, so that they stay within it.
func addEvents(p *plot.Plot, tl []Happening, unit, top float64, label func(Happening) bool) error {
	var lx plotter.XYs
	var ls []string
	var right []bool
	for _, h := range tl {
		x := h.At.Seconds() / unit
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: top}})
		if err != nil {
			return err
		}
		l.Color = colEvent
		l.Dashes = dotted
		p.Add(l)
		if !label(h) {
			continue
		}
		lx = append(lx, plotter.XY{X: x, Y: top * (0.93 - 0.08*float64(len(lx)%4))})
		late := x > p.X.Min+(p.X.Max-p.X.Min)*2/3
		right = append(right, late)
		if late {
			ls = append(ls, h.What+" ")
		} else {
			ls = append(ls, " "+h.What)
		}
	}
	if len(lx) == 0 {
		return nil
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: lx, Labels: ls})
	if err != nil {
		return err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Color = colEvent
		l.TextStyle[i].Font.Size = vg.Points(8)
		if right[i] {
			l.TextStyle[i].XAlign = text.XRight
		}
	}
	p.Add(l)
	return nil
}

// compactTicks are plot.DefaultTicks with short labels: 250k, 2.5k, 0.4.
var compactTicks = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = compact(ticks[i].Value)
		}
	}
	return ticks
})

func compact(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// timeTicks labels a time axis every 1, 2, 5, 10, … units, about ten times.
var timeTicks = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
	span := hi - lo
	step := 1.0
	for _, s := range []float64{1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 1200, 3600} {
		step = s
		if span/s <= 12 {
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
})

// binXYs places per-second values at the middle of their second.
func binXYs(vs []float64, unit float64) plotter.XYs {
	out := make(plotter.XYs, len(vs))
	for i, v := range vs {
		out[i] = plotter.XY{X: (float64(i) + 0.5) * Bin.Seconds() / unit, Y: v}
	}
	return out
}

// timeUnit picks the x axis unit for a run of d: seconds, minutes or hours.
func timeUnit(d time.Duration) (float64, string) {
	switch {
	case d > 3*time.Hour:
		return 3600, "h"
	case d > 10*time.Minute:
		return 60, "min"
	}
	return 1, "s"
}

// capacityPanels draws, per modelled callee with an objective, its fleet's
// knee against the capacity the controller estimated, and what its
// callers offered, its sidecars admitted and it answered well.
func capacityPanels(r *Result, unit float64, xlabel string, first bool) ([][]*plot.Plot, error) {
	var rows [][]*plot.Plot
	for _, m := range MeasureCapacity(r) {
		s := m.Series
		offered := make([]float64, len(s.Knee))
		for _, b := range r.Buckets {
			if b.Callee == s.Callee {
				for i, v := range b.Offered {
					offered[i] += v / Bin.Seconds()
				}
			}
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: the fleet's knee, the capacity the controller estimated from its objective, offered, admitted and goodput", s.Callee)
		if first && len(rows) == 0 {
			p.Title.Text = fmt.Sprintf("%s · seed %d\n%s", r.Scenario.Name, r.Seed, p.Title.Text)
		}
		p.Y.Label.Text = "rps"
		p.X.Label.Text = xlabel
		p.Y.Tick.Marker, p.X.Tick.Marker = compactTicks, timeTicks
		p.Add(plotter.NewGrid())
		top := 1.0
		for _, v := range [][]float64{s.Knee, s.Estimate, offered, s.Admitted} {
			for _, x := range v {
				if !math.IsInf(x, 0) {
					top = max(top, x)
				}
			}
		}
		p.Y.Min, p.Y.Max = 0, top*1.4
		p.X.Min, p.X.Max = 0, r.Scenario.Duration.Seconds()/unit
		for _, l := range []struct {
			name   string
			v      []float64
			c      color.Color
			width  float64
			dashes []vg.Length
		}{
			{"offered", offered, colOffered, 1.5, nil},
			{"admitted", s.Admitted, colAdmitted, 1.5, nil},
			{"goodput (controller's view)", s.Goodput, palette[2], 1, nil},
			{"knee (the model's)", s.Knee, colAllowed, 1, dashed},
			{"estimated capacity", s.Estimate, palette[3], 2, nil},
		} {
			if err := addSeries(p, l.name, binXYs(l.v, unit), l.c, l.width, l.dashes); err != nil {
				return nil, err
			}
		}
		if err := addEvents(p, r.Timeline, unit, p.Y.Max, func(h Happening) bool { return h.Callee == s.Callee }); err != nil {
			return nil, err
		}
		p.Legend.Top = true
		rows = append(rows, []*plot.Plot{p})
	}
	return rows, nil
}
