package sidecar

import (
	"math"
	"strconv"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"
)

// Unit is what a service's limits count (issue #16): requests, or cost
// units. The zero value is UnitRequests.
type Unit uint8

const (
	// UnitRequests: every request weighs 1.
	UnitRequests Unit = iota
	// UnitCost: a request weighs its price (see CostPolicy), and every rate
	// of the policy but the descriptors' is in units per second.
	UnitCost
)

func (u Unit) String() string {
	switch u {
	case UnitRequests:
		return "requests"
	case UnitCost:
		return "cost"
	}
	return "Unit(" + strconv.Itoa(int(u)) + ")"
}

// CostPolicy says how a sidecar prices a request of a service whose Unit is
// UnitCost, most specific first: RequestHeader, when set and the request's
// value is a valid cost; else its procedure's static cost; else, for a
// service whose cost comes from the response, the leaf's mean reported cost;
// else Default. Immutable, as its Policy.
type CostPolicy struct {
	Default float64 // ≥ 0
	// Procedures are static costs of declared procedures (or names.Other),
	// each at most once, in the order received.
	Procedures []ProcedureCost
	// RequestHeader is the lower-case header (gRPC metadata key) of a
	// request's own cost, which the service trusts; "": none.
	RequestHeader string
	// ResponseHeader is the lower-case header or trailer the app reports an
	// admitted request's real cost in; "": the price at admission stands.
	ResponseHeader string
	// Max is the largest believable cost: a larger one is clamped to it
	// (counted). > 0.
	Max float64
}

// ProcedureCost is one procedure's static cost.
type ProcedureCost struct {
	Procedure string
	Cost      float64
}

// costFromProto converts and checks a policy's unit and cost into p.
// declared are the procedures a static cost may name.
func costFromProto(m *sluicev1.DropPolicy, p *Policy, declared map[string]struct{}, bad func(field, format string, args ...any)) {
	switch m.GetUnit() {
	case sluicev1.Unit_UNIT_UNSPECIFIED:
		p.Unit = UnitRequests
	case sluicev1.Unit_UNIT_COST:
		p.Unit = UnitCost
		if p.Direction == Outbound {
			bad("unit", "UNIT_COST in an outbound policy")
		}
	default:
		bad("unit", "unknown value %d", int32(m.GetUnit()))
	}
	mc := m.GetCost()
	if mc == nil {
		return
	}
	if p.Unit != UnitCost {
		bad("cost", "set, but unit is not UNIT_COST")
	}
	c := &CostPolicy{
		Default:        mc.GetDefaultCost(),
		RequestHeader:  mc.GetRequestHeader(),
		ResponseHeader: mc.GetResponseHeader(),
		Max:            mc.GetMaxCost(),
	}
	checkCost("cost.default_cost", c.Default, bad)
	if !(c.Max > 0) || math.IsInf(c.Max, 0) {
		bad("cost.max_cost", "%v is not a finite number > 0", c.Max)
	}
	for _, h := range []struct{ field, v string }{{"cost.request_header", c.RequestHeader}, {"cost.response_header", c.ResponseHeader}} {
		if h.v != "" {
			checkHeaderKey(h.field, h.v, bad)
		}
	}
	if n := len(mc.GetProcedures()); n > len(declared) {
		bad("cost.procedures", "%d procedures, more than the policy declares", n)
		p.Cost = c
		return
	}
	keys := procedureKeys{section: "cost.procedures", declared: declared, seen: make(map[string]int, len(mc.GetProcedures()))}
	for i, pc := range mc.GetProcedures() {
		f := "cost.procedures[" + strconv.Itoa(i) + "]"
		q := ProcedureCost{Procedure: pc.GetProcedure(), Cost: pc.GetCost()}
		keys.check(i, q.Procedure, bad)
		checkCost(f+".cost", q.Cost, bad)
		c.Procedures = append(c.Procedures, q)
	}
	p.Cost = c
}

// checkCost reports a cost that is not a finite number ≥ 0.
func checkCost(field string, v float64, bad func(field, format string, args ...any)) {
	if !(v >= 0) || math.IsInf(v, 1) {
		bad(field, "%v is not a finite number ≥ 0", v)
	}
}

// costProto is the inverse of costFromProto.
func costProto(p *Policy, m *sluicev1.DropPolicy) {
	if p.Unit == UnitCost {
		m.Unit = sluicev1.Unit_UNIT_COST
	}
	c := p.Cost
	if c == nil {
		return
	}
	m.Cost = &sluicev1.CostPolicy{
		DefaultCost:    c.Default,
		RequestHeader:  c.RequestHeader,
		ResponseHeader: c.ResponseHeader,
		MaxCost:        c.Max,
	}
	for _, q := range c.Procedures {
		m.Cost.Procedures = append(m.Cost.Procedures, &sluicev1.ProcedureCost{Procedure: q.Procedure, Cost: q.Cost})
	}
}

// ruleCostFromProto converts and checks a peer's concurrency cap and debt
// into r.
func ruleCostFromProto(f func(string) string, pp *sluicev1.PeerPolicy, dir Direction, r *Rule, bad func(field, format string, args ...any)) {
	if pp.MaxConcurrency != nil {
		r.MaxConcurrency = *pp.MaxConcurrency
		switch {
		case r.MaxConcurrency == 0:
			bad(f("max_concurrency"), "0: absent means no cap, and a cap is at least 1")
		case dir == Outbound:
			bad(f("max_concurrency"), "set in an outbound policy")
		}
	}
	r.Debt = pp.GetDebt()
	if !(r.Debt >= 0) || math.IsInf(r.Debt, 1) {
		bad(f("debt"), "%v is not a finite number ≥ 0", r.Debt)
	}
}

// checkHeaderKey reports a header (gRPC metadata) key a policy names that
// is not one lower-case header name, as a descriptor's source would read
// it.
func checkHeaderKey(field, key string, bad func(field, format string, args ...any)) {
	if src, err := descriptor.ParseSource("header " + key); err != nil || src.Header != key {
		bad(field, "%.64q is not a lower-case header name", key)
	}
}

// procedureKeys checks the procedures a policy's per-procedure entries
// name (criticality.procedures, cost.procedures): each declared, or
// names.Other, and listed once.
type procedureKeys struct {
	section  string // the entries' field, for errors
	declared map[string]struct{}
	seen     map[string]int // procedure → its first entry's index
}

func (k *procedureKeys) check(i int, proc string, bad func(field, format string, args ...any)) {
	f := k.section + "[" + strconv.Itoa(i) + "].procedure"
	_, ok := k.declared[proc]
	j, dup := k.seen[proc]
	switch {
	case proc == "" || !ok:
		bad(f, "%.64q is neither declared in procedures nor %q", proc, names.Other)
	case dup:
		bad(f, "%.64q is listed again, first at %s[%d]", proc, k.section, j)
	default:
		k.seen[proc] = i
	}
}
