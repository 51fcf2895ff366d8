package sim

import (
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// AbuserTolerance is how close an abuser's admitted rate must stay to its
// limit, relative to it, to count as enforced: ±10 %, widened by four
// standard deviations of an exact limiter's count (√limit: an exact ratio
// applied to Poisson arrivals admits a Poisson count of mean limit), since
// at tens of rps the noise of any limiter is wider than 10 % of a second's
// count.
const AbuserTolerance = 0.10

// abuserWithin reports whether admitted, one second's count, is within
// AbuserTolerance of limit.
func abuserWithin(admitted, limit float64) bool {
	return math.Abs(admitted-limit) <= AbuserTolerance*limit+4*math.Sqrt(limit)
}

// TenantMeasures are Cloudflare's measures of a run's tenants.
type TenantMeasures struct {
	Requests int64
	// WronglyLimited and WronglyAllowed are shares of all the tenants'
	// requests, per tenant and second: the drops of seconds within the
	// limit, resp. what seconds over it admitted beyond it, over Σ offered
	// (TenantCounts.add). Shortfall is the share seconds over the limit
	// admitted below it. CompliantLimited is the wrongly limited share of
	// the compliant requests alone, PinnedLimited of the pinned compliant
	// tenants' requests, WarmLimited of the compliant requests from
	// AbuseFrom on.
	WronglyLimited, WronglyAllowed, Shortfall, CompliantLimited, PinnedLimited, WarmLimited float64
	// AbuserError is the mean over the enforced abusers of |mean admitted
	// rate − limit| / limit over their seconds from enforcement to the end
	// of the run; NaN if none was enforced.
	AbuserError float64
	// TimeToEnforce is, per abuser, from AbuseFrom to the first second from
	// which every second's admitted count stays within AbuserTolerance of
	// its limit (0: from the first second of abuse); the mean and the
	// slowest over the enforced abusers. Unenforced counts the others,
	// Slow the enforced ones slower than GoalTimeToEnforce.
	MeanTimeToEnforce, MaxTimeToEnforce time.Duration
	Unenforced, Slow                    int
}

// MeasureTenants computes a run's tenant measures.
func MeasureTenants(r *TenantResult) TenantMeasures {
	c, a := r.Compliant, r.Abusive
	m := TenantMeasures{Requests: c.Offered + a.Offered, AbuserError: math.NaN(), MaxTimeToEnforce: -1, MeanTimeToEnforce: -1}
	if m.Requests > 0 {
		m.WronglyLimited = (c.WronglyLimited + a.WronglyLimited) / float64(m.Requests)
		m.WronglyAllowed = (c.WronglyAllowed + a.WronglyAllowed) / float64(m.Requests)
		m.Shortfall = (c.Shortfall + a.Shortfall) / float64(m.Requests)
	}
	if c.Offered > 0 {
		m.CompliantLimited = c.WronglyLimited / float64(c.Offered)
	}
	if p := r.Pinned; p.Offered > 0 {
		m.PinnedLimited = p.WronglyLimited / float64(p.Offered)
	}
	if w := r.Warm; w.Offered > 0 {
		m.WarmLimited = w.WronglyLimited / float64(w.Offered)
	}
	from := int(r.Tenants.AbuseFrom / Bin)
	var errSum float64
	var tteSum time.Duration
	enforced := 0
	for _, ab := range r.Abusers {
		n := len(ab.Admitted)
		if from >= n {
			continue
		}
		s0 := n
		for s0 > from && abuserWithin(ab.Admitted[s0-1], ab.Limit) {
			s0--
		}
		if s0 == n {
			m.Unenforced++
			continue
		}
		sum := 0.0
		for _, v := range ab.Admitted[s0:] {
			sum += v
		}
		errSum += math.Abs(sum/float64(n-s0)-ab.Limit) / ab.Limit
		tte := time.Duration(s0-from) * Bin
		tteSum += tte
		m.MaxTimeToEnforce = max(m.MaxTimeToEnforce, tte)
		if tte > GoalTimeToEnforce {
			m.Slow++
		}
		enforced++
	}
	if enforced > 0 {
		m.AbuserError = errSum / float64(enforced)
		m.MeanTimeToEnforce = tteSum / time.Duration(enforced)
	}
	return m
}

// The goals (#15), Cloudflare's figures where it names them.
const (
	GoalWronglyLimited = 0.00003 // < 0.003 % of requests
	GoalAbuserError    = 0.05    // ≤ 5 %
	GoalTimeToEnforce  = 2 * time.Second
)

// writeTenants writes the tenants' section of a summary.
func writeTenants(b *strings.Builder, r *TenantResult) {
	t := r.Tenants
	m := MeasureTenants(r)
	sticky := 0
	for _, ab := range r.Abusers {
		if ab.Sticky {
			sticky++
		}
	}
	fmt.Fprintf(b, "\ntenants: %s to %s via %s (descriptor %s, limit %s rps, %d overrides), Zipf exponent %v, %s rps; %s pinned to one sidecar\n",
		count(float64(t.Count)), t.Callee, t.Caller, t.Descriptor, rate(t.Limit), len(t.Overrides), t.Exponent, rate(t.Rate), pct(t.Sticky))
	fmt.Fprintf(b, "  %d abusers at %v× their limit from %s (%d of them pinned) · %s requests decided, %s distinct tenants seen\n",
		len(r.Abusers), t.AbuseFactor, at(t.AbuseFrom), sticky, count(float64(r.Requests)), count(float64(r.Seen)))
	tte, maxTTE := "-", "-"
	if m.MaxTimeToEnforce >= 0 {
		tte, maxTTE = dur(m.MeanTimeToEnforce.Round(10*time.Millisecond)), dur(m.MaxTimeToEnforce)
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MEASURE\tGOT\tGOAL\t")
	fmt.Fprintf(tw, "  wrongly limited (all requests)\t%s\t< %s\t%s\n", pct(m.WronglyLimited), goalPct(GoalWronglyLimited), verdict(m.WronglyLimited < GoalWronglyLimited))
	fmt.Fprintf(tw, "  wrongly limited (compliant tenants' requests)\t%s\t\t\n", pct(m.CompliantLimited))
	fmt.Fprintf(tw, "  wrongly limited (pinned compliant tenants' requests)\t%s\t\t\n", pct(m.PinnedLimited))
	fmt.Fprintf(tw, "  wrongly limited (compliant tenants' requests from %s, the fleet warm)\t%s\t\t\n", at(t.AbuseFrom), pct(m.WarmLimited))
	fmt.Fprintf(tw, "  wrongly allowed (all requests)\t%s\t\t\n", pct(m.WronglyAllowed))
	fmt.Fprintf(tw, "  admitted below the limit in seconds over it (all requests)\t%s\t\t\n", pct(m.Shortfall))
	fmt.Fprintf(tw, "  abusers' admitted rate, mean error\t%s\t≤ %s\t%s\n", pct(m.AbuserError), goalPct(GoalAbuserError), verdict(m.AbuserError <= GoalAbuserError))
	fmt.Fprintf(tw, "  time to enforce an abuser, mean / slowest\t%s / %s\t≤ %s\t%s\n", tte, maxTTE, dur(GoalTimeToEnforce),
		verdict(m.MaxTimeToEnforce >= 0 && m.MaxTimeToEnforce <= GoalTimeToEnforce && m.Unenforced == 0))
	fmt.Fprintf(tw, "  abusers enforced later than %s / never\t%d / %d\t0\t\n", dur(GoalTimeToEnforce), m.Slow, m.Unenforced)
	_ = tw.Flush()
	res := r.Resources
	fmt.Fprintf(b, "  sidecar memory: descriptor sketch %s bytes · most values a policy listed: %d\n", count(float64(res.SketchBytes)), res.Listed)
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "NOT MET"
}

// TenantCosts are what a run's descriptor cost the sidecars and each link:
// the numbers the number of tenants must not drive (issue #15).
type TenantCosts struct {
	SketchBytes int // one sidecar's sketch for the descriptor
	Listed      int // the most values one policy listed
	// Bytes per second on each link, all services together (proto.Size).
	Reports, ZoneLoads, Policies float64
}

// Costs returns r's tenant costs; ok is false when r has no tenants.
func Costs(r *Result) (c TenantCosts, ok bool) {
	if r.Tenants == nil {
		return c, false
	}
	d := r.Scenario.Duration
	return TenantCosts{
		SketchBytes: r.Tenants.Resources.SketchBytes,
		Listed:      r.Tenants.Resources.Listed,
		Reports:     r.ControlPlane.Reports.PerSecond(d),
		ZoneLoads:   r.ControlPlane.ZoneLoads.PerSecond(d),
		Policies:    r.ControlPlane.Policies.PerSecond(d),
	}, true
}

// CostDifference is one cost of two runs: the relative difference,
// |a − b| / max(a, b) (0 when both are 0).
type CostDifference struct {
	Name string
	A, B float64
	Diff float64
	// Bounded says the issue bounds the difference (< 10 %): sidecar
	// memory and each link's bytes per second. How many values a policy
	// lists is shown beside them: it follows which tenants are heavy,
	// which the two populations only nearly share (their Zipf sums differ
	// by a tenth), and the bytes it costs are bounded as the policies'.
	Bounded bool
}

// CompareCosts sets two runs' costs side by side, sidecar memory first.
func CompareCosts(a, b TenantCosts) []CostDifference {
	out := []CostDifference{
		{Name: "sidecar sketch bytes", A: float64(a.SketchBytes), B: float64(b.SketchBytes), Bounded: true},
		{Name: "values listed in a policy (most)", A: float64(a.Listed), B: float64(b.Listed)},
		{Name: "sidecars→aggregators B/s", A: a.Reports, B: b.Reports, Bounded: true},
		{Name: "aggregators→controller B/s", A: a.ZoneLoads, B: b.ZoneLoads, Bounded: true},
		{Name: "controller→sidecars B/s", A: a.Policies, B: b.Policies, Bounded: true},
	}
	for i := range out {
		if m := max(out[i].A, out[i].B); m > 0 {
			out[i].Diff = math.Abs(out[i].A-out[i].B) / m
		}
	}
	return out
}
