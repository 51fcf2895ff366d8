package live

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// Margins are how far a live measure may lie outside the range the
// deterministic mode gives over several seeds and still agree with it.
//
// The range over seeds is most of the tolerance: the seed draws the phases
// of every report, flush and tick, and a live run's phases are as random
// (the processes start when they start). What the range can not hold is
// what only the real run has: network and processing time, a loaded
// scheduler on two vCPUs, a policy push that takes a few milliseconds on
// loopback where the simulator assumes its push delay. The margins cover
// that. Docs: docs/simulation.md, "Live mode".
type Margins struct {
	// TimeToEnforce: whole seconds, the bins of the measure; a few
	// milliseconds can move the first accurate second across a boundary.
	TimeToEnforce time.Duration
	// Shift is how much earlier or later than in any seed the loop may act
	// in a live run. The peak overshoot and the wrongly allowed share of a
	// surge are mostly the part of its first second before the ratio
	// arrived, so their margins are Shift times the surge's excess over the
	// allowed rate (and the wrongly dropped share's, Shift times the rate
	// that goes on being dropped after a surge ends, which is also the
	// collateral's margin for a caller that was over its limit).
	Shift time.Duration
	// SteadyStateError, in points of the allowed rate: the per-second noise
	// of a real run (reports over windows that are not exactly an
	// interval, requests counted by the second they left). Also added to
	// the peak overshoot's margin, since a steady second can be the peak.
	SteadyStateError float64
	// Collateral, and the floor of the wrongly dropped and allowed shares'
	// margins: points of the offered requests.
	Collateral float64
}

// DefaultMargins are the tolerances docs/simulation.md explains.
func DefaultMargins() Margins {
	return Margins{TimeToEnforce: time.Second, Shift: 200 * time.Millisecond, SteadyStateError: 0.02, Collateral: 0.005}
}

// Comparison is a live run next to the deterministic mode on the same scaled
// scenario.
type Comparison struct {
	Live    *Result
	Seed    uint64      // the deterministic run shown beside live
	Seeds   []uint64    // the seeds the ranges are over, Seed first
	Sim     *sim.Result // Seed's run; its Scenario is named <name>-sim
	Margins Margins
	Rows    []Row
	// Granular lists the over-limit callers whose time to enforce and
	// steady-state error are not judged: ±5 % of their allowed rate is
	// less than one request per sidecar of their callee. Error diffusion
	// admits n·p of n requests at each sidecar give or take one, and with
	// deterministic arrivals every sidecar of a callee rounds alike, so the
	// deterministic mode's admitted rate moves in steps of one request per
	// sidecar: such a caller is never within ±5 % there, or only by chance.
	Granular []Granular
	// LoadError holds, per over-limit caller whose load went out off its
	// schedule, the load generator's own error in its over-limit seconds:
	// the mean of |sent − nominal| / nominal. A stall that moves 35 of a
	// second's 500 requests into the next second makes both seconds 7 %
	// off their nominal rate, and the ratio, set from earlier seconds, can
	// not follow within the second: that error is the machine's, not the
	// loop's, and the deterministic mode has none. It is added to that
	// caller's steady-state error tolerance and printed under the table; 0
	// when the load kept its schedule.
	LoadError map[string]float64
}

// Granular is an over-limit caller whose allowed rate is too low, at the
// scale run, for the ±5 % measures to mean anything.
type Granular struct {
	Bucket   sim.Bucket
	Allowed  float64 // its lowest allowed rate while over its limit, rps
	Sidecars int     // its callee's
}

// Row is one measure of one caller (or of all callers) in both modes.
type Row struct {
	Caller, Measure string
	Duration        bool    // a time in seconds, else a fraction
	Live, Sim       float64 // NaN: no value (no episode, no steady second); +Inf: never enforced
	Min, Max        float64 // over the seeds' runs, NaN-free; NaN when every seed had none
	SimNaN          int     // seeds without a value
	Margin          float64 // beyond [Min, Max]
	// Judged is false for a measure the scale makes a matter of rounding
	// (see Comparison.Granular); Agree is then not counted.
	Judged bool
	Agree  bool
}

// Agree reports whether every judged measure agrees.
func (c *Comparison) Agree() bool {
	judged := 0
	for _, r := range c.Rows {
		if !r.Judged {
			continue
		}
		judged++
		if !r.Agree {
			return false
		}
	}
	return judged > 0
}

// Compare runs the deterministic mode on live's scaled scenario with seeds
// seed, seed+1, …, seed+n-1, and sets every measure of the live run beside
// seed's run and the range over all of them.
func Compare(live *Result, seed uint64, n int, m Margins) (*Comparison, error) {
	if n < 1 {
		return nil, errors.New("compare: at least one seed is required")
	}
	c := &Comparison{Live: live, Seed: seed, Margins: m}
	var sums []sim.Summary
	for i := range n {
		s := seed + uint64(i)
		r, err := sim.Run(live.Scaled, s, sim.Options{})
		if err != nil {
			return nil, fmt.Errorf("deterministic mode: %w", err)
		}
		c.Seeds = append(c.Seeds, s)
		sums = append(sums, sim.Summarize(r))
		if i == 0 {
			named := *r.Scenario
			named.Name = live.Scaled.Name + "-sim"
			r.Scenario = &named
			c.Sim = r
		}
	}
	lv := sim.Summarize(&live.Result)
	total := 0.0
	excessAll, holdAll := 0.0, 0.0
	for bi := range live.Buckets {
		lm := lv.Callers[bi]
		name := lm.Bucket.String()
		over := lm.Over()
		for _, s := range sums {
			over = over || s.Callers[bi].Over()
		}
		excess, hold, factor := surgeExcess(&c.Sim.Buckets[bi])
		offered := lm.Offered
		sidecars := calleeSidecars(live.Scaled, lm.Bucket.Callee)
		judged := true
		if low := lowestAllowed(&c.Sim.Buckets[bi]); over && low*sim.Tolerance < float64(sidecars) {
			judged = false
			c.Granular = append(c.Granular, Granular{Bucket: lm.Bucket, Allowed: low, Sidecars: sidecars})
		}
		// One request per sidecar, over the requests the share is of: the
		// rounding of error diffusion.
		quantum := func(requests float64) float64 {
			if requests > 0 {
				return float64(sidecars) / requests
			}
			return 0
		}
		total += offered
		excessAll += excess
		holdAll += hold
		pick := func(f func(sim.Measures) float64) (float64, []float64) {
			var vs []float64
			for _, s := range sums {
				vs = append(vs, f(s.Callers[bi]))
			}
			return f(lm), vs
		}
		share := func(v float64) float64 {
			if offered > 0 {
				return v / offered
			}
			return 0
		}
		if over {
			v, vs := pick(tte)
			c.add(name, "time to enforce", true, v, vs, m.TimeToEnforce.Seconds()).Judged = judged
			v, vs = pick(func(x sim.Measures) float64 { return x.PeakOvershoot })
			c.add(name, "peak overshoot", false, v, vs, m.Shift.Seconds()*(factor-1)+m.SteadyStateError)
			le := loadError(&live.Buckets[bi], live.sentOf(bi))
			if le > 0 {
				if c.LoadError == nil {
					c.LoadError = map[string]float64{}
				}
				c.LoadError[name] = le
			}
			v, vs = pick(func(x sim.Measures) float64 { return x.SteadyStateError })
			c.add(name, "steady-state error", false, v, vs, m.SteadyStateError+le).Judged = judged
			// The one measure in absolute terms: every other is relative
			// to the limit, and a run against twice the limits overshoots,
			// errs and releases by the same shares. Its margin is what the
			// shares' margins allow either way, the steady error on what
			// got through, and a request per sidecar (judged for a
			// granular caller too: the rounding is in the margin).
			v, vs = pick(admittedShare)
			c.add(name, "admitted", false, v, vs,
				m.Collateral+share(m.Shift.Seconds()*(excess+hold))+(m.SteadyStateError+le)*admittedShare(lm)+quantum(offered))
		}
		// A caller over its limit loses its collateral after its own
		// surge, while its ratio is released: the same shift moves the
		// release as it moves the wrongly dropped share's, here as a
		// share of the requests it offered within its limit. A
		// bystander's hold is 0: its collateral has no edge to shift.
		release := 0.0
		if lm.CollateralOffered > 0 {
			release = m.Shift.Seconds() * hold / lm.CollateralOffered
		}
		v, vs := pick(func(x sim.Measures) float64 { return x.Collateral })
		c.add(name, "collateral", false, v, vs, m.Collateral+quantum(lm.CollateralOffered)+release)
		if over {
			v, vs = pick(func(x sim.Measures) float64 { return x.WronglyDropped })
			c.add(name, "wrongly dropped", false, v, vs, m.Collateral+share(m.Shift.Seconds()*hold))
			v, vs = pick(func(x sim.Measures) float64 { return x.WronglyAllowed })
			c.add(name, "wrongly allowed", false, v, vs, m.Collateral+share(m.Shift.Seconds()*excess))
		}
	}
	pickAll := func(f func(sim.Summary) float64) (float64, []float64) {
		var vs []float64
		for _, s := range sums {
			vs = append(vs, f(s))
		}
		return f(lv), vs
	}
	shareAll := func(v float64) float64 {
		if total > 0 {
			return v / total
		}
		return 0
	}
	if lv.Bystanders > 0 {
		v, vs := pickAll(func(s sim.Summary) float64 { return s.BystanderCollateral })
		c.add("all callers", "bystanders' collateral", false, v, vs, m.Collateral+float64(live.Scaled.Sidecars())/max(lv.BystanderOffered, 1))
	}
	v, vs := pickAll(func(s sim.Summary) float64 { return s.WronglyDropped })
	c.add("all callers", "wrongly dropped", false, v, vs, m.Collateral+shareAll(m.Shift.Seconds()*holdAll))
	v, vs = pickAll(func(s sim.Summary) float64 { return s.WronglyAllowed })
	c.add("all callers", "wrongly allowed", false, v, vs, m.Collateral+shareAll(m.Shift.Seconds()*excessAll))
	return c, nil
}

// admittedShare is the share of a caller's offered requests admitted.
func admittedShare(m sim.Measures) float64 {
	if m.Offered > 0 {
		return m.Admitted / m.Offered
	}
	return 0
}

// tte is a caller's time to enforce in seconds: +Inf when an episode was
// never enforced, NaN without an episode.
func tte(m sim.Measures) float64 {
	switch {
	case !m.Over():
		return math.NaN()
	case m.Unenforced > 0:
		return math.Inf(1)
	}
	return m.TimeToEnforce.Seconds()
}

// loadError is the mean of |sent − nominal| / nominal over b's
// over-limit seconds (nominal above allowed): see Comparison.LoadError. 0
// without sent counts.
func loadError(b *sim.BucketSeries, sent []float64) float64 {
	sum, n := 0.0, 0
	for i := range sent {
		if i >= len(b.Nominal) || i >= len(b.Allowed) {
			break
		}
		nom := b.Nominal[i]
		if nom > 0 && nom > b.Allowed[i] {
			sum += math.Abs(sent[i]-nom) / nom
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// surgeExcess reads a bucket's nominal and allowed series: excess is the sum
// over its rises past the allowed rate of how far each second's nominal rate
// rose above the previous second's (or the allowed rate, if higher); hold
// is the sum over its falls from over the allowed rate of the rate that
// goes on arriving, at most the allowed rate; factor is the highest
// nominal ÷ allowed.
func surgeExcess(b *sim.BucketSeries) (excess, hold, factor float64) {
	factor = 1
	for i := range b.Nominal {
		nom, allowed := b.Nominal[i], b.Allowed[i]
		if math.IsInf(allowed, 1) || !(allowed > 0) {
			continue
		}
		factor = max(factor, nom/allowed)
		prev := 0.0
		if i > 0 {
			prev = b.Nominal[i-1]
		}
		if nom > allowed && nom > prev*(1+sim.Tolerance) {
			excess += nom - max(prev, allowed)
		}
		if i > 0 && prev > b.Allowed[i-1] && nom < prev*(1-sim.Tolerance) {
			hold += min(nom, allowed)
		}
	}
	return excess, hold, factor
}

// add appends a row and returns it (a scratch row when neither mode has the
// measure).
func (c *Comparison) add(caller, measure string, duration bool, live float64, seeds []float64, margin float64) *Row {
	r := Row{Caller: caller, Measure: measure, Duration: duration, Live: live, Sim: seeds[0],
		Min: math.NaN(), Max: math.NaN(), Margin: margin, Judged: true}
	for _, v := range seeds {
		switch {
		case math.IsNaN(v):
			r.SimNaN++
		case math.IsNaN(r.Min):
			r.Min, r.Max = v, v
		default:
			r.Min, r.Max = min(r.Min, v), max(r.Max, v)
		}
	}
	if math.IsNaN(live) && r.SimNaN == len(seeds) {
		return &Row{} // a measure neither mode has: nothing to compare
	}
	switch {
	case math.IsNaN(live):
		r.Agree = r.SimNaN > 0
	case math.IsNaN(r.Min):
		r.Agree = false
	case math.IsInf(live, 1):
		r.Agree = math.IsInf(r.Max, 1)
	default:
		r.Agree = live >= r.Min-margin-1e-12 && live <= r.Max+margin+1e-12
	}
	c.Rows = append(c.Rows, r)
	return &c.Rows[len(c.Rows)-1]
}

// calleeSidecars counts a callee's sidecars in all zones.
func calleeSidecars(sc *sim.Scenario, callee string) int {
	n := 0
	if svc := sc.Service(callee); svc != nil {
		for _, k := range svc.Sidecars {
			n += k
		}
	}
	return n
}

// lowestAllowed is a bucket's lowest allowed rate in the seconds its
// nominal rate is over it; +Inf when it never is.
func lowestAllowed(b *sim.BucketSeries) float64 {
	low := math.Inf(1)
	for i := range b.Nominal {
		if b.Nominal[i] > b.Allowed[i] {
			low = min(low, b.Allowed[i])
		}
	}
	return low
}

// Write prints the comparison: one table, both modes side by side, and the
// verdict.
func (c *Comparison) Write(w io.Writer) error {
	var b strings.Builder
	sc := c.Live.Scaled
	last := c.Seeds[len(c.Seeds)-1]
	fmt.Fprintf(&b, "live vs deterministic: %s at scale %g, %d sidecars · the same scaled scenario in both modes; deterministic seed %d, and the range over seeds %d–%d\n\n",
		sc.Name, c.Live.Scaling.Factor, sc.Sidecars(), c.Seed, c.Seeds[0], last)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "CALLER\tMEASURE\tLIVE\tSIM (SEED %d)\tSIM, SEEDS %d–%d\tLIVE − SIM\tTOLERANCE\tAGREE\n", c.Seed, c.Seeds[0], last)
	prev := ""
	agree := 0
	var bad []string
	for _, r := range c.Rows {
		name := r.Caller
		if name == prev {
			name = ""
		}
		prev = r.Caller
		verdict := "yes"
		switch {
		case !r.Judged:
			verdict = "not judged"
			if !r.Agree {
				verdict += " (no)"
			}
		case r.Agree:
			agree++
		default:
			verdict = "NO"
			bad = append(bad, r.Caller+" "+r.Measure)
		}
		rng := "-"
		if !math.IsNaN(r.Min) {
			rng = r.value(r.Min) + " … " + r.value(r.Max)
			if r.SimNaN > 0 {
				rng += fmt.Sprintf(" (%d without)", r.SimNaN)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, r.Measure, r.value(r.Live), r.value(r.Sim), rng,
			r.diff(), "seeds ± "+r.margin(), verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	judged := agree + len(bad)
	if len(bad) == 0 {
		fmt.Fprintf(&b, "\nagreement: live and deterministic mode agree on all %d measures judged\n", judged)
	} else {
		fmt.Fprintf(&b, "\nagreement: live and deterministic mode agree on %d of %d measures judged; NOT on %s\n", agree, judged, strings.Join(bad, ", "))
	}
	for _, name := range slices.Sorted(maps.Keys(c.LoadError)) {
		fmt.Fprintf(&b, "%s's steady-state error tolerance includes the load generator's own error in its over-limit seconds, %s: the machine sent them off their schedule, which the deterministic mode never does.\n", name, points(c.LoadError[name])+" pts")
	}
	for _, g := range c.Granular {
		fmt.Fprintf(&b, "not judged: %s's time to enforce and steady-state error. At this scale it is allowed %s rps across %d sidecars, so ±5 %% of that is less than one request per sidecar: error diffusion rounds by one request at each sidecar, and the deterministic mode's sidecars all round alike. A larger --scale or fewer --sidecars makes them count.\n",
			g.Bucket, strconv.FormatFloat(g.Allowed, 'f', -1, 64), g.Sidecars)
	}
	if l := c.Live.Load; !l.Healthy() {
		fmt.Fprintf(&b, "WARNING: the live run did not go as scheduled (%s): the machine was too busy, so this comparison says little; run it again on a quieter machine\n", l.trouble())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r Row) value(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, 1):
		return "never"
	case r.Duration:
		return strconv.FormatFloat(v, 'f', -1, 64) + "s"
	case r.Measure == "peak overshoot" && v > 0:
		return "+" + percent(v)
	}
	return percent(v)
}

func (r Row) diff() string {
	d := r.Live - r.Sim
	switch {
	case math.IsNaN(d) || math.IsInf(r.Live, 0) || math.IsInf(r.Sim, 0):
		return "-"
	case r.Duration:
		return signed(strconv.FormatFloat(d, 'f', -1, 64), d) + "s"
	}
	return signed(points(d), d) + " pts"
}

func (r Row) margin() string {
	if r.Duration {
		return strconv.FormatFloat(r.Margin, 'f', -1, 64) + "s"
	}
	return points(r.Margin) + " pts"
}

func signed(s string, v float64) string {
	if v > 0 {
		return "+" + s
	}
	return s
}

// percent formats a fraction: 0.12%, 3.4%, 13%, 802%.
func percent(v float64) string {
	if v == 0 {
		return "0%"
	}
	return points(v) + "%"
}

// points formats a fraction in percentage points, to a sensible precision.
func points(v float64) string {
	x := v * 100
	a := math.Abs(x)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case a >= 0.1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strconv.FormatFloat(x, 'f', 3, 64)
}
