package sim

import (
	"fmt"
	"math/rand/v2"
	"strconv"
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
