package sim

import (
	"math"
	"time"
)

// Tolerance is how close, relative to the allowed rate, a caller's admitted
// rate must be for a second to count as enforced: ±5 %.
const Tolerance = 0.05

// Measures are one caller's numbers over a run, computed by Measure from its
// BucketSeries. Every measure works on whole bins (seconds):
//
//   - a bin is over limit when offered > allowed (the oracle's allowed rate
//     for that bin); an episode is a maximal run of over-limit bins;
//   - time to enforce, per episode: from the episode's first bin to the first
//     bin of the episode whose admitted rate is within ±Tolerance of the
//     allowed rate. TimeToEnforce is the longest over the enforced episodes;
//   - peak overshoot: the highest (admitted − allowed) / allowed over all
//     over-limit bins, before enforcement included;
//   - steady-state error: the mean of |admitted − allowed| / allowed over the
//     steady bins. A bin of an episode is steady once the loop has settled
//     since the last change of demand: the episode's first bin is a change,
//     and so is every bin whose nominal rate differs from the previous bin's
//     by more than Tolerance; from a change on, bins are steady from the
//     first one within ±Tolerance of the allowed rate (that one included)
//     to the next change. So a surge that is enforced and then holds is
//     steady from enforcement to its end, but the seconds in which it ends,
//     or steps up again, are transients (they show in the overshoot and the
//     wrongly dropped/allowed shares instead) until the loop catches up;
//   - collateral drop rate: dropped / offered over the bins that are not over
//     limit (offered ≤ allowed): requests lost while the caller was within
//     its rights, e.g. to another caller's surge or to slow release;
//   - wrongly dropped and wrongly allowed (Cloudflare's measure): with
//     ideal = min(offered, allowed) per bin (offered for a shadow caller),
//     Σ max(0, ideal − admitted) / Σ offered and
//     Σ max(0, admitted − ideal) / Σ offered over all bins;
//   - loss after a surge: after each episode, dropped / offered in its
//     first bin back within the allowed rate (AfterFirst), and from the
//     second such bin on to the next episode or the end (AfterRest, and
//     AfterWorst, the worst of those bins): what
//     slow release, or a ratio that arrives late, costs a caller that is
//     back under its allowance;
//   - ratio reversals per minute: how often the drop ratio the sidecars hold
//     (the series' Ratio, one value per bin) changes direction, counting a
//     move as one once it is ReversalStep away from the last turn: a ratio
//     that rises, falls and rises again turns twice; noise of less than
//     ReversalStep is not a turn.
//
// Measures that have no bins to work on are NaN (TimeToEnforce: -1).
type Measures struct {
	Bucket Bucket
	Shadow bool
	Limit  float64 // configured; +Inf: none
	// Cost: the bucket's callee counts cost, and the measures are in cost
	// units (BucketSeries.Measured).
	Cost bool

	Offered, Admitted, Dropped, Retries float64 // totals, requests
	PeakOffered                         float64 // highest offered rate of a bin, rps

	OverBins   int // bins over limit
	Episodes   int
	Unenforced int // episodes that never came within ±Tolerance

	TimeToEnforce    time.Duration // -1: no enforced episode
	PeakOvershoot    float64
	SteadyStateError float64
	SteadyBins       int

	Collateral                           float64
	CollateralOffered, CollateralDropped float64

	WronglyDropped, WronglyAllowed float64

	// AfterFirst and AfterRest are dropped / offered after the episodes:
	// in the first bin back within the allowed rate, and from the second
	// on; NaN without such bins. AfterFirstOffered, AfterRestOffered and
	// the Dropped pair are their sums, requests.
	AfterFirst, AfterRest                float64
	AfterFirstOffered, AfterFirstDropped float64
	AfterRestOffered, AfterRestDropped   float64
	AfterWorst                           float64 // the highest dropped / offered of a bin from the second on; NaN: none
	Reversals                            int     // turns of the ratio, see ReversalStep
	ReversalsPerMinute                   float64 // Reversals over the series' length
}

// ReversalStep is how far, in drop ratio, a ratio must move away from its
// last turn before the move counts: one point, about the noise of a ratio
// held against a few thousand rps.
const ReversalStep = 0.01

// Reversals counts the turns of a ratio series: a move of at least
// ReversalStep against the direction of the last move, measured from the
// extreme reached since.
func Reversals(ratio []float64) int {
	if len(ratio) == 0 {
		return 0
	}
	n, dir := 0, 0 // dir: +1 rising, -1 falling, 0 not yet moved
	lo, hi := ratio[0], ratio[0]
	ext := ratio[0] // the extreme since the last turn
	for _, r := range ratio[1:] {
		switch dir {
		case 0:
			lo, hi = min(lo, r), max(hi, r)
			if r >= lo+ReversalStep {
				dir, ext = 1, r
			} else if r <= hi-ReversalStep {
				dir, ext = -1, r
			}
		case 1:
			if r > ext {
				ext = r
			} else if r <= ext-ReversalStep {
				n++
				dir, ext = -1, r
			}
		case -1:
			if r < ext {
				ext = r
			} else if r >= ext+ReversalStep {
				n++
				dir, ext = 1, r
			}
		}
	}
	return n
}

// Over reports whether the caller was ever over its allowed rate.
func (m *Measures) Over() bool { return m.OverBins > 0 }

// Measure computes a caller's measures from its series; see Measures for
// the definitions. bin is the width of one entry.
func Measure(b *BucketSeries, bin time.Duration) Measures {
	m := Measures{
		Bucket: b.Bucket(), Shadow: b.Shadow, Limit: b.Limit, Cost: b.Cost != nil,
		TimeToEnforce: -1,
		PeakOvershoot: math.NaN(), SteadyStateError: math.NaN(), Collateral: math.NaN(),
		AfterFirst: math.NaN(), AfterRest: math.NaN(), AfterWorst: math.NaN(),
	}
	n := len(b.Offered)
	over := func(i int) bool { return !b.Shadow && b.Offered[i] > b.Allowed[i] }
	within := func(i int) bool {
		return math.Abs(b.Admitted[i]-b.Allowed[i]) <= Tolerance*b.Allowed[i]
	}
	demand := b.Nominal
	if demand == nil {
		demand = b.Offered
	}
	changed := func(i int) bool {
		return i > 0 && math.Abs(demand[i]-demand[i-1]) > Tolerance*demand[i-1]
	}
	steadySum := 0.0
	var wrongDrop, wrongAllow float64
	for i := 0; i < n; i++ {
		off, adm := b.Offered[i], b.Admitted[i]
		m.Offered += off
		m.Admitted += adm
		m.Dropped += b.Dropped[i]
		if b.Retries != nil {
			m.Retries += b.Retries[i]
		}
		m.PeakOffered = max(m.PeakOffered, off)
		ideal := off
		if !b.Shadow {
			ideal = min(off, b.Allowed[i])
		}
		wrongDrop += max(0, ideal-adm)
		wrongAllow += max(0, adm-ideal)
		if !over(i) {
			m.CollateralOffered += off
			m.CollateralDropped += b.Dropped[i]
		}
	}
	// Episodes.
	for i := 0; i < n; {
		if !over(i) {
			i++
			continue
		}
		start := i
		for i < n && over(i) {
			i++
		}
		end := i // exclusive
		m.Episodes++
		m.OverBins += end - start
		enforced, settled := -1, false
		for j := start; j < end; j++ {
			os := (b.Admitted[j] - b.Allowed[j]) / b.Allowed[j]
			if math.IsNaN(m.PeakOvershoot) || os > m.PeakOvershoot {
				m.PeakOvershoot = os
			}
			if enforced < 0 && within(j) {
				enforced = j
			}
			if j == start || changed(j) {
				settled = false
			}
			if !settled && within(j) {
				settled = true
			}
			if settled {
				steadySum += math.Abs(os)
				m.SteadyBins++
			}
		}
		if enforced < 0 {
			m.Unenforced++
			continue
		}
		m.TimeToEnforce = max(m.TimeToEnforce, time.Duration(enforced-start)*bin)
	}
	// After the episodes: the bins back within the allowed rate.
	for i := 1; i < n; i++ {
		if over(i) || !over(i-1) {
			continue
		}
		m.AfterFirstOffered += b.Offered[i]
		m.AfterFirstDropped += b.Dropped[i]
		for j := i + 1; j < n && !over(j); j++ {
			m.AfterRestOffered += b.Offered[j]
			m.AfterRestDropped += b.Dropped[j]
			if b.Offered[j] > 0 && !(b.Dropped[j]/b.Offered[j] <= m.AfterWorst) {
				m.AfterWorst = b.Dropped[j] / b.Offered[j]
			}
		}
	}
	if m.AfterFirstOffered > 0 {
		m.AfterFirst = m.AfterFirstDropped / m.AfterFirstOffered
	}
	if m.AfterRestOffered > 0 {
		m.AfterRest = m.AfterRestDropped / m.AfterRestOffered
	}
	m.Reversals = Reversals(b.Ratio)
	if n > 0 {
		m.ReversalsPerMinute = float64(m.Reversals) / (float64(n) * bin.Minutes())
	}
	if m.SteadyBins > 0 {
		m.SteadyStateError = steadySum / float64(m.SteadyBins)
	}
	if m.CollateralOffered > 0 {
		m.Collateral = m.CollateralDropped / m.CollateralOffered
	}
	if m.Offered > 0 {
		m.WronglyDropped = wrongDrop / m.Offered
		m.WronglyAllowed = wrongAllow / m.Offered
	}
	return m
}

// Summary gathers a run's measures: per caller, and over the scenario.
type Summary struct {
	Callers []Measures
	// Bystanders are the callers never over their allowed rate; their
	// collateral drop rate is Σ dropped / Σ offered over the whole run.
	Bystanders                                                int
	BystanderCollateral                                       float64 // NaN without bystanders
	BystanderOffered, BystanderDropped                        float64
	WronglyDropped, WronglyAllowed                            float64       // over all callers' offered requests
	WorstTimeToEnforce                                        time.Duration // -1: none enforced
	WorstSteadyStateError                                     float64       // NaN: none
	Unenforced                                                int           // episodes never enforced, all callers
	ReportBytesPerSec, ZoneLoadBytesPerSec, PolicyBytesPerSec float64
	Targets                                                   []TargetCheck
}

// TargetCheck is one of a scenario's targets against what the run reached.
type TargetCheck struct {
	Name string // "time to enforce", "steady-state error", "collateral drops"
	Goal string // "≤ 1.5s"
	Got  string
	Met  bool
}

// Summarize measures every caller of r and the scenario as a whole.
func Summarize(r *Result) Summary {
	s := Summary{
		BystanderCollateral:   math.NaN(),
		WorstTimeToEnforce:    -1,
		WorstSteadyStateError: math.NaN(),
	}
	var offered, wrongDrop, wrongAllow float64
	for i := range r.Buckets {
		m := Measure(r.Buckets[i].Measured(), Bin)
		s.Callers = append(s.Callers, m)
		offered += m.Offered
		wrongDrop += m.WronglyDropped * m.Offered
		wrongAllow += m.WronglyAllowed * m.Offered
		if !m.Over() {
			s.Bystanders++
			s.BystanderOffered += m.Offered
			s.BystanderDropped += m.Dropped
			continue
		}
		s.Unenforced += m.Unenforced
		s.WorstTimeToEnforce = max(s.WorstTimeToEnforce, m.TimeToEnforce)
		if !math.IsNaN(m.SteadyStateError) && !(m.SteadyStateError <= s.WorstSteadyStateError) {
			s.WorstSteadyStateError = m.SteadyStateError
		}
	}
	if s.BystanderOffered > 0 {
		s.BystanderCollateral = s.BystanderDropped / s.BystanderOffered
	}
	if offered > 0 {
		s.WronglyDropped = wrongDrop / offered
		s.WronglyAllowed = wrongAllow / offered
	}
	d := r.Scenario.Duration
	s.ReportBytesPerSec = r.ControlPlane.Reports.PerSecond(d)
	s.ZoneLoadBytesPerSec = r.ControlPlane.ZoneLoads.PerSecond(d)
	s.PolicyBytesPerSec = r.ControlPlane.Policies.PerSecond(d)

	t := r.Scenario.Targets
	if t.TimeToEnforce != nil {
		c := TargetCheck{Name: "time to enforce", Goal: "≤ " + t.TimeToEnforce.String()}
		switch {
		case s.WorstTimeToEnforce < 0:
			c.Got = "never"
		default:
			c.Got = s.WorstTimeToEnforce.String()
			c.Met = s.Unenforced == 0 && s.WorstTimeToEnforce <= *t.TimeToEnforce
		}
		s.Targets = append(s.Targets, c)
	}
	if t.SteadyStateError != nil {
		c := TargetCheck{Name: "steady-state error", Goal: "≤ " + goalPct(*t.SteadyStateError), Got: pct(s.WorstSteadyStateError)}
		c.Met = s.WorstSteadyStateError <= *t.SteadyStateError
		s.Targets = append(s.Targets, c)
	}
	if t.CollateralDrops != nil {
		c := TargetCheck{Name: "collateral drops", Goal: "< " + goalPct(*t.CollateralDrops), Got: pct(s.BystanderCollateral)}
		c.Met = s.BystanderCollateral < *t.CollateralDrops
		s.Targets = append(s.Targets, c)
	}
	return s
}
