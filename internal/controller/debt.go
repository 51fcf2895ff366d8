package controller

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// Cost units and debt (issue #16). A callee counting cost runs the law on
// its buckets' offered cost rates against limits and capacities in its
// units. A bucket whose requests turn out, once their responses report
// it, to cost more than they were admitted at runs its admitted cost above
// its own limit: the overshoot is its debt (dropratio.DebtStep), and the
// law holds it to a lower limit until it is paid back
// (dropratio.DebtLimit), so that over the payback window its admitted
// cost meets its limit. Debt is kept only for the buckets of a callee
// counting cost with a finite limit of their own (a leaf's, or the
// caller's for a callee without procedures), at most one per bucket the
// law runs over, and forgotten once it is 0.

// DefaultCostPayback is the payback window of a bucket's debt when
// StateConfig.CostPayback is 0.
const DefaultCostPayback = 10 * time.Second

// debtKey names a bucket that can owe: a (callee, caller) pair, or a
// leaf; its tiers share it.
type debtKey struct{ service, caller, procedure string }

// leafLimit returns the limit the law holds the bucket (caller,
// procedure) of lim to, given its configured limit l.
type leafLimit func(lim *limits.Service, caller, procedure string, l float64) float64

func (s *State) payback() time.Duration { return cmp.Or(s.cfg.CostPayback, DefaultCostPayback) }

// debtLimit is the State's leafLimit: l lowered by the bucket's debt.
func (s *State) debtLimit(lim *limits.Service, caller, procedure string, l float64) float64 {
	if !lim.Counted() {
		return l
	}
	return dropratio.DebtLimit(l, s.debts[debtKey{lim.Name, caller, procedure}], s.payback())
}

// offered is the bucket's load for the law: its cost rate for a callee
// counting cost (lim), else its request rate.
func (p *peerTotals) offered(lim *limits.Service) float64 {
	if lim.Counted() {
		return p.OfferedCost
	}
	return p.Offered
}

// ownLimit is the limit of lim's bucket (caller, procedure) alone, its
// tiers' and its debt's: the leaf's for a callee with procedures, else
// the caller's.
func ownLimit(lim *limits.Service, caller, procedure string) float64 {
	if lim.HasProcedures() {
		return lim.LeafLimit(caller, procedure)
	}
	return lim.Bucket(caller).Limit
}

// stepDebts moves every debt a step of dt on, from the admitted cost rates
// of inbound, and returns the sum of the debts per callee, for metrics
// (nil when none owes). A bucket that owes and is not in inbound admitted
// nothing; one whose callee no longer counts cost, or that lost its
// limit, owes nothing.
func (s *State) stepDebts(dt time.Duration, inbound map[string][]peerTotals, set *limits.Set) map[string]float64 {
	admitted := make(map[debtKey]float64, len(s.debts))
	for k := range s.debts {
		admitted[k] = 0
	}
	for svc, peers := range inbound {
		lim := set.Service(svc)
		if !lim.Counted() {
			continue
		}
		for _, p := range peers { // sorted: a bucket's tiers add up in one order
			if !math.IsInf(ownLimit(lim, p.peer, p.procedure), 1) {
				admitted[debtKey{svc, p.peer, p.procedure}] += p.AdmittedCost
			}
		}
	}
	var sums map[string]float64
	for _, k := range slices.SortedFunc(maps.Keys(admitted), compareDebtKeys) {
		l := math.Inf(1)
		if lim := set.Service(k.service); lim.Counted() {
			l = ownLimit(lim, k.caller, k.procedure)
		}
		d := dropratio.DebtStep(s.debts[k], admitted[k], l, dt, s.payback())
		if d == 0 {
			delete(s.debts, k)
			continue
		}
		s.debts[k] = d
		if sums == nil {
			sums = map[string]float64{}
		}
		sums[k.service] += d
	}
	return sums
}

func compareDebtKeys(a, b debtKey) int {
	return cmp.Or(cmp.Compare(a.service, b.service), cmp.Compare(a.caller, b.caller), cmp.Compare(a.procedure, b.procedure))
}

// costPolicy renders how lim's sidecars price a request; nil unless lim
// counts cost. Procedures are sorted, so that replicas publish the same
// bytes.
func costPolicy(lim *limits.Service) *sluicev1.CostPolicy {
	if !lim.Counted() {
		return nil
	}
	c := lim.Cost
	cp := &sluicev1.CostPolicy{DefaultCost: c.Default, RequestHeader: c.RequestHeader, ResponseHeader: c.ResponseHeader, MaxCost: c.Max}
	for _, proc := range slices.Sorted(maps.Keys(c.Procedures)) {
		cp.Procedures = append(cp.Procedures, &sluicev1.ProcedureCost{Procedure: proc, Cost: c.Procedures[proc]})
	}
	return cp
}

// markCost adds to pp, lim's bucket of v inbound, its cap on requests in
// flight and its debt.
func (s *State) markCost(pp *sluicev1.PeerPolicy, v dropratio.Verdict, lim *limits.Service, service string) {
	if c := lim.MaxConcurrency(v.Caller, v.Procedure); c > 0 {
		pp.MaxConcurrency = &c
	}
	if lim.Counted() {
		pp.Debt = s.debts[debtKey{service, v.Caller, v.Procedure}]
	}
}
