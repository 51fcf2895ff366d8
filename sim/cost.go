package sim

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// FlowCost is what a flow's requests cost at a callee whose limits count
// cost (issue #16, `unit: cost`).
type FlowCost struct {
	// Header, when HasHeader, is the price each request carries in the
	// request header the callee trusts (its limits' cost.from): the
	// sidecars decide it with DecideHTTPCost or DecideGRPCCost.
	Header    float64
	HasHeader bool
	// Response, when set, is what each admitted request really costs,
	// reported by the app in the response header the callee's limits name
	// (cost.response): the sidecars learn it only through Decision.Done.
	Response *ResponseCost
}

// ResponseCost is the real cost of a flow's requests: each request's is
// drawn uniformly from [mean − Spread, mean + Spread], mean as Means says at
// the time it is offered, from the run's seeded random source.
type ResponseCost struct {
	Spread float64
	// Means are the mean cost from each point's At on, in order, the
	// first at 0.
	Means []CostPoint
}

// CostPoint is a mean cost from At on.
type CostPoint struct {
	At   time.Duration
	Mean float64
}

// MeanAt returns the mean cost at t.
func (r *ResponseCost) MeanAt(t time.Duration) float64 {
	m := r.Means[0].Mean
	for _, p := range r.Means[1:] {
		if p.At > t {
			break
		}
		m = p.Mean
	}
	return m
}

// draw returns one request's cost at t.
func (r *ResponseCost) draw(rng *rand.Rand, t time.Duration) float64 {
	m := r.MeanAt(t)
	if r.Spread == 0 {
		return m
	}
	return m - r.Spread + 2*r.Spread*rng.Float64()
}

// CostAt is what a request of flow f costs on average at t at its callee
// svc: its reported mean, else its header's price, else the static price
// of its procedure in the limits, else the callee's default; 1 at a callee
// that counts requests.
func CostAt(svc *limits.Service, f *Flow, t time.Duration) float64 {
	if !svc.Counted() {
		return 1
	}
	if c := f.Cost; c != nil {
		switch {
		case c.Response != nil:
			return c.Response.MeanAt(t)
		case c.HasHeader:
			return c.Header
		}
	}
	if v, ok := svc.Cost.Procedures[f.Leaf]; ok {
		return v
	}
	return svc.Cost.Default
}

type fileFlowCost struct {
	Header   *float64          `yaml:"header"`
	Response *fileResponseCost `yaml:"response"`
}

type fileResponseCost struct {
	Mean   *float64        `yaml:"mean"`
	Spread *float64        `yaml:"spread"`
	Steps  []fileCostPoint `yaml:"steps"`
}

type fileCostPoint struct {
	At   *duration.Value `yaml:"at"`
	Mean *float64        `yaml:"mean"`
}

// buildFlowCost checks a flow's cost against its callee's limits: a cost
// needs a callee counting cost, a header price one that trusts a request
// header, and a callee whose app reports costs needs the flow to say what
// they are (cost.response).
func buildFlowCost(fc *fileFlowCost, svc *limits.Service, tiered bool, path string, bad func(string, string, ...any)) *FlowCost {
	if !svc.Counted() {
		bad(path, "the callee counts requests: a cost needs its limits' unit: cost")
		return nil
	}
	if tiered {
		bad(path, "criticality tiers at a callee counting cost are not simulated yet")
	}
	if fc == nil {
		fc = &fileFlowCost{}
	}
	c := &FlowCost{}
	number := func(p string, v float64) bool {
		if !(v >= 0) || math.IsInf(v, 0) || v > svc.Cost.Max {
			bad(p, "%v is not a cost in [0, the callee's cost.max %v]", v, svc.Cost.Max)
			return false
		}
		return true
	}
	if fc.Header != nil {
		if svc.Cost.RequestHeader == "" {
			bad(path+".header", "the callee trusts no request header for a cost (its limits' cost.from)")
		} else if number(path+".header", *fc.Header) {
			c.Header, c.HasHeader = *fc.Header, true
		}
	}
	fr := fc.Response
	switch {
	case fr == nil && svc.Cost.ResponseHeader != "":
		bad(path+".response", "missing: the callee's app reports what requests cost (its limits' cost.response), so the flow must say what they cost")
	case fr != nil && svc.Cost.ResponseHeader == "":
		bad(path+".response", "the callee's app reports no cost (its limits name no cost.response)")
	case fr != nil:
		r := &ResponseCost{Spread: deref(fr.Spread, 0)}
		if (fr.Mean == nil) == (fr.Steps == nil) {
			bad(path+".response", "needs exactly one of mean, steps")
		}
		if fr.Mean != nil && number(path+".response.mean", *fr.Mean) {
			r.Means = []CostPoint{{Mean: *fr.Mean}}
		}
		if fr.Steps != nil && len(fr.Steps) == 0 {
			bad(path+".response.steps", "at least one point is required")
		}
		for i, fp := range fr.Steps {
			p := fmt.Sprintf("%s.response.steps[%d]", path, i)
			var pt CostPoint
			switch {
			case fp.At == nil:
				bad(p+".at", "missing")
			case i == 0 && *fp.At != 0:
				bad(p+".at", "%v: the first point is at 0s", time.Duration(*fp.At))
			case i > 0 && len(r.Means) > 0 && time.Duration(*fp.At) <= r.Means[len(r.Means)-1].At:
				bad(p+".at", "%v is not after the previous point's", time.Duration(*fp.At))
			default:
				pt.At = time.Duration(*fp.At)
			}
			if fp.Mean == nil {
				bad(p+".mean", "missing")
			} else if number(p+".mean", *fp.Mean) {
				pt.Mean = *fp.Mean
			}
			r.Means = append(r.Means, pt)
		}
		for _, m := range r.Means {
			if !(r.Spread >= 0 && r.Spread <= m.Mean) {
				bad(path+".response.spread", "%v is outside [0, mean %v]: a cost is never negative", r.Spread, m.Mean)
				break
			}
		}
		if len(r.Means) > 0 {
			c.Response = r
		}
	}
	if !c.HasHeader && c.Response == nil {
		return nil
	}
	return c
}

// headerValue is the request header a flow's price goes out in.
func (c *FlowCost) headerValue() string {
	if c == nil || !c.HasHeader {
		return ""
	}
	return strconv.FormatFloat(c.Header, 'f', -1, 64)
}

// CostSeries is a bucket's traffic in cost units per bin, at a callee whose
// limits count cost: what its requests cost, offered and admitted (a
// request's real cost, the one its response reports when the flow's
// requests report one), and what the scenario expects of it (Expect).
// The bucket's Limit is then in units per second, and Measure judges
// these series (BucketSeries.Measured).
type CostSeries struct {
	Nominal, Offered, Admitted, Allowed []float64
	// Debt is the units the bucket owes (admitted above its limit, not
	// yet paid back), as the policy its callee's sidecars held at the end
	// of each bin says.
	Debt []float64
}

// Measured returns the series Measure judges: b itself, or at a callee
// counting cost, b's traffic in cost units.
func (b *BucketSeries) Measured() *BucketSeries {
	c := b.Cost
	if c == nil {
		return b
	}
	dropped := make([]float64, len(c.Offered))
	for i := range dropped {
		dropped[i] = c.Offered[i] - c.Admitted[i]
	}
	return &BucketSeries{
		Callee: b.Callee, Caller: b.Caller, Procedure: b.Procedure, Shadow: b.Shadow, Limit: b.Limit,
		Nominal: c.Nominal, Offered: c.Offered, Admitted: c.Admitted, Dropped: dropped, Allowed: c.Allowed,
		Ratio: b.Ratio, Cost: c,
	}
}

// debt is the units bs owes, as the policy its callee's sidecars hold says
// (every sidecar of a callee holds the same one).
func (e *engine) debt(bs *bucketState) float64 {
	c := e.callees[bs.callee]
	if len(c.sidecars) == 0 {
		return 0
	}
	p := c.sidecars[0].lim.Policy(c.svc.Name)
	if p == nil {
		return 0
	}
	if r := p.Leaf(bs.b.Caller, bs.b.Procedure); r != nil {
		return r.Debt
	}
	return 0
}

// CostWindowLen is the window the cost measures average over: a debt is
// paid back within the controller's payback window (--cost-payback, 10s),
// so that the window that saw it meets the limit.
const CostWindowLen = 10 * time.Second

// CostWindow is one window of a bucket counting cost, in units per second
// (Debt in units, at the window's end).
type CostWindow struct {
	From, To                   time.Duration
	Offered, Admitted, Allowed float64
	// Error is admitted / min(offered, allowed) − 1: how far the bucket's
	// admitted cost was from what it was entitled to.
	Error float64
	Debt  float64
	// Judged: the window starts a payback window after the controller's
	// warm-up: during the warm-up it publishes nothing, and everything
	// admitted meanwhile above the limit is debt, paid back over the
	// payback window after it.
	Judged bool
}

// DebtEpisode is a stretch of seconds in which a bucket owed a debt worth
// noting: at its peak at least dropratio.LevelBand of a payback window
// of its limit.
type DebtEpisode struct {
	From, To time.Duration // the first second owing, and the end of the last
	Peak     float64
	PeakAt   time.Duration // the end of the second it peaked in
	PaidBack bool          // To is before the end of the run
}

// CostMeasures are one bucket's cost measures.
type CostMeasures struct {
	Bucket  Bucket
	Limit   float64 // units/s
	Windows []CostWindow
	Debts   []DebtEpisode
}

// MeasureCost returns the cost measures of r's buckets at callees counting
// cost, in r's order; nil when there are none.
func MeasureCost(r *Result) []CostMeasures {
	var out []CostMeasures
	per := int(CostWindowLen / Bin)
	cfg := r.Scenario.Loop.Controller
	payback := cmp.Or(cfg.CostPayback, controller.DefaultCostPayback)
	judged := cfg.Warmup + payback
	for i := range r.Buckets {
		b := &r.Buckets[i]
		c := b.Cost
		if c == nil {
			continue
		}
		m := CostMeasures{Bucket: b.Bucket(), Limit: b.Limit}
		n := len(c.Offered)
		for from := 0; from+per <= n; from += per {
			w := CostWindow{From: time.Duration(from) * Bin, To: time.Duration(from+per) * Bin}
			for j := from; j < from+per; j++ {
				w.Offered += c.Offered[j]
				w.Admitted += c.Admitted[j]
				w.Allowed += min(c.Allowed[j], c.Offered[j])
			}
			secs := CostWindowLen.Seconds()
			w.Offered, w.Admitted, w.Allowed = w.Offered/secs, w.Admitted/secs, w.Allowed/secs
			w.Error = math.NaN()
			if w.Allowed > 0 {
				w.Error = w.Admitted/w.Allowed - 1
			}
			w.Debt = c.Debt[from+per-1]
			w.Judged = w.From >= judged
			m.Windows = append(m.Windows, w)
		}
		worth := dropratio.LevelBand * b.Limit * payback.Seconds()
		for j := 0; j < n; {
			if c.Debt[j] == 0 {
				j++
				continue
			}
			ep := DebtEpisode{From: time.Duration(j) * Bin}
			for ; j < n && c.Debt[j] > 0; j++ {
				if c.Debt[j] > ep.Peak {
					ep.Peak, ep.PeakAt = c.Debt[j], time.Duration(j+1)*Bin
				}
			}
			ep.To, ep.PaidBack = time.Duration(j)*Bin, j < n
			if ep.Peak >= worth {
				m.Debts = append(m.Debts, ep)
			}
		}
		out = append(out, m)
	}
	return out
}

// writeCost writes the cost measures: per bucket, its windows.
func writeCost(b *strings.Builder, ms []CostMeasures) {
	fmt.Fprintf(b, "\ncost (units/s, mean over %v windows; error: admitted against min(offered, allowed); debt: what the bucket owes at the window's end, in units; windows before the controller's warm-up and a payback window after it are not judged, in brackets):\n", CostWindowLen)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  bucket\twindow\toffered\tadmitted\tallowed\terror\tdebt\t")
	for _, m := range ms {
		name := m.Bucket.String()
		for _, w := range m.Windows {
			e := signedPct(w.Error)
			if !w.Judged {
				e = "(" + e + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s–%s\t%s\t%s\t%s\t%s\t%s\t\n", name, at(w.From), at(w.To), rate(w.Offered), rate(w.Admitted), rate(w.Allowed), e, count(w.Debt))
			name = ""
		}
	}
	tw.Flush()
	for _, m := range ms {
		if len(m.Debts) == 0 {
			fmt.Fprintf(b, "  %s: limit %s units/s, never in debt worth noting\n", m.Bucket, rate(m.Limit))
			continue
		}
		fmt.Fprintf(b, "  %s: limit %s units/s, in debt", m.Bucket, rate(m.Limit))
		for i, d := range m.Debts {
			sep := ";"
			if i == 0 {
				sep = ""
			}
			paid := "not paid back by the end"
			if d.PaidBack {
				paid = "paid back by " + at(d.To)
			}
			fmt.Fprintf(b, "%s %s–%s: peak %s units at %s, %s", sep, at(d.From), at(d.To), count(d.Peak), at(d.PeakAt), paid)
		}
		b.WriteString("\n")
	}
}
