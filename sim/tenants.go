package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/names"
)

// Tenants is a population of many tenants calling one callee through one
// caller, each request carrying its tenant as the value of one of the
// callee's descriptors (issue #15): the traffic of a per-tenant limit.
//
// Tenant i (i = 1..Count, named TenantName(i)) sends Rate·i^-Exponent/H rps,
// H = Σ_j j^-Exponent: a Zipf law whose rates add up to Rate. Arrivals are
// Poisson. A Sticky share of the tenants, picked at random, is pinned to one
// sidecar of the callee, picked at random: all its requests go there
// (sticky routing, consistent hashing); the others' requests spread
// uniformly over the callee's sidecars. From AbuseFrom on, Abusers tenants
// picked at random send AbuseFactor times their limit instead of their
// Zipf rate.
type Tenants struct {
	Callee, Caller string
	// Descriptor names the callee's descriptor limit (in the scenario's
	// limits) whose values the tenants are.
	Descriptor  string
	Count       int
	Exponent    float64
	Rate        float64
	Sticky      float64 // share of tenants, in [0, 1]
	Abusers     int
	AbuseFactor float64
	AbuseFrom   time.Duration // whole seconds
	// Limit and Overrides are the descriptor's limits, from the callee's
	// limits: what the oracle holds each tenant to.
	Limit     float64
	Overrides map[string]float64
}

// TenantName returns the value tenant i (1-based) sends: "t" and i
// zero-padded to the digits of MaxTenants, so that every name has one
// length whatever the scenario's count, and runs with different counts put
// the same bytes per value on the wire (a real tenant ID has one format).
func TenantName(i int) string { return fmt.Sprintf("t%0*d", tenantDigits, i) }

var tenantDigits = len(strconv.Itoa(MaxTenants))

// tenantPop is a run's population: who is pinned where, who abuses, and
// every tenant's name, as flat arrays indexed by rank (0-based: tenant
// rank+1). Nothing per request depends on Count.
type tenantPop struct {
	t     *Tenants
	zipf  *zipf
	names string // every name, back to back: a name is a substring, no allocation
	width int
	pin   []int32 // per tenant: its sidecar's index, or -1: spread
	abuse []int32 // per tenant: its index in abusers, or -1
	// abusers are the abusive tenants' ranks, in the order drawn.
	abusers   []int32
	overrides map[int32]float64 // by rank, the Overrides that name a tenant
}

func newTenantPop(t *Tenants, sidecars int, r *rand.Rand) *tenantPop {
	p := &tenantPop{
		t:         t,
		zipf:      newZipf(t.Count, t.Exponent),
		width:     len(TenantName(t.Count)),
		pin:       make([]int32, t.Count),
		abuse:     make([]int32, t.Count),
		overrides: map[int32]float64{},
	}
	buf := make([]byte, 0, p.width*t.Count)
	for i := range t.Count {
		buf = append(buf, TenantName(i+1)...)
		p.pin[i] = -1
		p.abuse[i] = -1
		if r.Float64() < t.Sticky {
			p.pin[i] = int32(r.IntN(sidecars))
		}
	}
	p.names = string(buf)
	for len(p.abusers) < t.Abusers {
		i := r.IntN(t.Count)
		if p.abuse[i] < 0 {
			p.abuse[i] = int32(len(p.abusers))
			p.abusers = append(p.abusers, int32(i))
		}
	}
	for name, l := range t.Overrides {
		if i, ok := p.rank(name); ok {
			p.overrides[int32(i)] = l
		}
	}
	return p
}

// name returns tenant rank i's value.
func (p *tenantPop) name(i int) string { return p.names[i*p.width : (i+1)*p.width] }

// rank returns the rank of the tenant named name.
func (p *tenantPop) rank(name string) (int, bool) {
	if len(name) != p.width || name[0] != 't' {
		return 0, false
	}
	n, err := strconv.Atoi(name[1:])
	if err != nil || n < 1 || n > p.t.Count {
		return 0, false
	}
	return n - 1, true
}

// limit returns tenant rank i's limit in rps.
func (p *tenantPop) limit(i int) float64 {
	if l, ok := p.overrides[int32(i)]; ok {
		return l
	}
	return p.t.Limit
}

// rate returns tenant rank i's nominal rate at t.
func (p *tenantPop) rate(i int, t time.Duration) float64 {
	if p.abuse[i] >= 0 && t >= p.t.AbuseFrom {
		return p.t.AbuseFactor * p.limit(i)
	}
	return p.t.Rate * p.zipf.Prob(i)
}

// TenantResult is what a run's tenants offered, and what the oracle made
// of it. Counts are requests.
type TenantResult struct {
	Tenants *Tenants
	// Requests is the number of tenant requests the sidecars decided.
	Requests int64
	// Seen is the number of distinct tenants that sent a request.
	Seen int
	// Compliant counts the requests of tenants while they do not abuse
	// (every tenant but the abusers, and the abusers before AbuseFrom),
	// Abusive the abusers' from AbuseFrom on.
	Compliant, Abusive TenantCounts
	// Pinned is the part of Compliant sent by tenants pinned to one
	// sidecar, whose whole rate meets one sidecar's local allowance.
	Pinned TenantCounts
	// Warm is the part of Compliant from AbuseFrom on: a fleet whose
	// tenants did not all start at once, at the simulation's first
	// second, with nothing listed.
	Warm TenantCounts
	// Abusers holds each abuser's series, one entry per Bin.
	Abusers []AbuserSeries
	// Resources are the loop's costs that the number of tenants must not
	// drive.
	Resources TenantResources
}

// TenantCounts are one class's totals. WronglyLimited and WronglyAllowed
// are Cloudflare's measures, per tenant and second (see MeasureTenants);
// Shortfall is what seconds over the limit admitted below it.
type TenantCounts struct {
	Offered, Admitted                         int64
	WronglyLimited, WronglyAllowed, Shortfall float64
}

// add counts a tenant's second: offered requests, admitted of them, under
// limit (its limit times the second). In a second within the limit every
// drop was wrong (Cloudflare's false positive: a request limited though
// its client was under the threshold). In a second over it, every request
// admitted beyond the limit was wrongly allowed, and the requests the
// limit would have admitted but the loop dropped are a shortfall: an error
// of the abuser's admitted rate, which AbuserError measures, not a request
// of a client under its threshold.
func (c *TenantCounts) add(offered, admitted uint32, limit float64) {
	c.Offered += int64(offered)
	c.Admitted += int64(admitted)
	if float64(offered) <= limit {
		c.WronglyLimited += float64(offered - admitted)
		return
	}
	c.WronglyAllowed += max(0, float64(admitted)-limit)
	c.Shortfall += max(0, limit-float64(admitted))
}

// AbuserSeries is one abusive tenant's traffic.
type AbuserSeries struct {
	Tenant            string
	Limit             float64
	Sticky            bool
	Offered, Admitted []float64
}

// TenantResources is what the loop spent on the tenants' descriptor, as the
// production code reports it.
type TenantResources struct {
	// SketchBytes is one sidecar's heavy-hitter sketch memory for the
	// descriptor; Listed the most values a policy listed for it.
	SketchBytes int
	Listed      int
}

// tenantOracle counts every tenant's requests per second exactly, in flat
// arrays, and folds each second into the run's totals when it ends.
type tenantOracle struct {
	pop               *tenantPop
	offered, admitted []uint32 // per tenant, this second
	touched           []int32  // tenants with a request this second
	seen              []uint64 // bit per tenant: ever sent
	res               *TenantResult
	abuseBin          int
}

func newTenantOracle(p *tenantPop, nbins int) *tenantOracle {
	o := &tenantOracle{
		pop:      p,
		offered:  make([]uint32, p.t.Count),
		admitted: make([]uint32, p.t.Count),
		seen:     make([]uint64, (p.t.Count+63)/64),
		res:      &TenantResult{Tenants: p.t},
		abuseBin: int(p.t.AbuseFrom / Bin),
	}
	for _, i := range p.abusers {
		o.res.Abusers = append(o.res.Abusers, AbuserSeries{
			Tenant: p.name(int(i)), Limit: p.limit(int(i)), Sticky: p.pin[i] >= 0,
			Offered: make([]float64, nbins), Admitted: make([]float64, nbins),
		})
	}
	return o
}

// count records one request of tenant rank i.
func (o *tenantOracle) count(i int, admitted bool) {
	if o.offered[i] == 0 {
		o.touched = append(o.touched, int32(i))
	}
	o.offered[i]++
	if admitted {
		o.admitted[i]++
	}
}

// endSecond folds second bin into the totals and clears it (see
// TenantCounts.add).
func (o *tenantOracle) endSecond(bin int) {
	for _, i := range o.touched {
		off, adm := o.offered[i], o.admitted[i]
		o.offered[i], o.admitted[i] = 0, 0
		o.seen[i/64] |= 1 << (i % 64)
		limit := o.pop.limit(int(i)) * Bin.Seconds()
		c := &o.res.Compliant
		if a := o.pop.abuse[i]; a >= 0 && bin >= o.abuseBin {
			c = &o.res.Abusive
			o.res.Abusers[a].Offered[bin] = float64(off)
			o.res.Abusers[a].Admitted[bin] = float64(adm)
		} else if a >= 0 {
			o.res.Abusers[a].Offered[bin] = float64(off)
			o.res.Abusers[a].Admitted[bin] = float64(adm)
		}
		c.add(off, adm, limit)
		if c == &o.res.Compliant && o.pop.pin[i] >= 0 {
			o.res.Pinned.add(off, adm, limit)
		}
		if c == &o.res.Compliant && bin >= o.abuseBin {
			o.res.Warm.add(off, adm, limit)
		}
	}
	o.touched = o.touched[:0]
}

// result returns the totals, once the last second has ended.
func (o *tenantOracle) result() *TenantResult {
	o.res.Seen = 0
	for _, w := range o.seen {
		o.res.Seen += popcount(w)
	}
	return o.res
}

func popcount(w uint64) int {
	n := 0
	for ; w != 0; w &= w - 1 {
		n++
	}
	return n
}

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

// fileTenants is the YAML form of Tenants.
type fileTenants struct {
	Callee      string          `yaml:"callee"`
	Caller      string          `yaml:"caller"`
	Descriptor  string          `yaml:"descriptor"`
	Count       *int            `yaml:"count"`
	Exponent    *float64        `yaml:"exponent"`
	Rate        *float64        `yaml:"rate"`
	Sticky      *float64        `yaml:"sticky"`
	Abusers     *int            `yaml:"abusers"`
	AbuseFactor *float64        `yaml:"abuse_factor"`
	AbuseFrom   *duration.Value `yaml:"abuse_from"`
}

// MaxTenants bounds a scenario's tenants: the sampler, the population and
// the oracle hold about 45 bytes per tenant.
const MaxTenants = 10_000_000

// build checks the tenants against the scenario built so far (services and
// limits) and takes the descriptor's limits from the callee's limits.
func (ft *fileTenants) build(sc *Scenario, bad func(string, string, ...any)) *Tenants {
	const path = "tenants"
	t := &Tenants{
		Callee: ft.Callee, Caller: ft.Caller, Descriptor: ft.Descriptor,
		Count:       deref(ft.Count, 0),
		Exponent:    deref(ft.Exponent, 1),
		Rate:        deref(ft.Rate, 0),
		Sticky:      deref(ft.Sticky, 0),
		Abusers:     deref(ft.Abusers, 0),
		AbuseFactor: deref(ft.AbuseFactor, 10),
		AbuseFrom:   derefDuration(ft.AbuseFrom, 0),
	}
	if sc.Service(t.Callee) == nil {
		bad(path+".callee", "%q is not in services", t.Callee)
	}
	if err := names.Check(t.Caller); err != nil || t.Caller == names.Overflow || t.Caller == names.Unknown {
		bad(path+".caller", "invalid caller name: %v", errOr(err, "reserved"))
	}
	found := false
	var descs []limits.Descriptor
	if ls := sc.Limits.Service(t.Callee); ls != nil {
		descs = ls.Descriptors
	}
	for _, d := range descs {
		if d.Name == t.Descriptor {
			found = true
			t.Limit, t.Overrides = d.Limit, d.Overrides
		}
	}
	if !found {
		bad(path+".descriptor", "%q is not a descriptor of limits.services.%s", t.Descriptor, t.Callee)
	}
	if t.Count < 1 || t.Count > MaxTenants {
		bad(path+".count", "%d is outside [1, %d]", t.Count, MaxTenants)
	}
	if !(t.Exponent >= 0 && t.Exponent <= 5) {
		bad(path+".exponent", "%v is outside [0, 5]", t.Exponent)
	}
	if !(t.Rate > 0 && t.Rate <= 1e7) {
		bad(path+".rate", "%v is outside (0, 1e7]", t.Rate)
	}
	if !(t.Sticky >= 0 && t.Sticky <= 1) {
		bad(path+".sticky", "%v is not a share in [0, 1]", t.Sticky)
	}
	if t.Abusers < 0 || t.Abusers > t.Count || t.Abusers > 10000 {
		bad(path+".abusers", "%d is outside [0, min(count, 10000)]", t.Abusers)
	}
	if !(t.AbuseFactor > 0 && t.AbuseFactor <= 1000) {
		bad(path+".abuse_factor", "%v is outside (0, 1000]", t.AbuseFactor)
	}
	if t.AbuseFrom < 0 || t.AbuseFrom >= sc.Duration || t.AbuseFrom%Bin != 0 {
		bad(path+".abuse_from", "%v is not a whole second within the run [0, %v)", t.AbuseFrom, sc.Duration)
	}
	return t
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
