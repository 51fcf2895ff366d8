package sim

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// Expect fills in what the scenario expects of each series: Limit and
// Shadow from its limits (see BucketSeries.Limit), Nominal from its rate functions (averaged over
// each second at the scenario's step, as the simulator offers them), and
// Allowed from the oracle, given the nominal rates of all the callee's
// callers in that second (at a modelled callee with an objective, sharing
// the fleet's knee as its capacity: see Scenario.ModelledCapacity). Only
// Offered's length is read; every series gets
// one entry per second of it. Live mode calls it on the series it measured,
// so that both modes are judged by the same yardstick.
func Expect(sc *Scenario, buckets []BucketSeries) {
	type callee struct {
		leaves []Bucket
		idx    []int // into buckets
	}
	callees := map[string]*callee{}
	var order []string
	for i := range buckets {
		b := &buckets[i]
		svc := sc.Limits.Service(b.Callee)
		lb := svc.Bucket(b.Caller)
		b.Limit, b.Shadow = lb.Limit, lb.Mode == dropratio.Shadow
		if svc.HasProcedures() {
			b.Limit = min(b.Limit, svc.LeafLimit(b.Caller, b.Procedure))
		}
		n := len(b.Offered)
		b.Nominal = make([]float64, n)
		b.Allowed = make([]float64, n)
		var cost []float64 // at a callee counting cost: the nominal cost, units per bin
		if svc.Counted() {
			cost = make([]float64, n)
		}
		steps := int(Bin / sc.Step)
		for _, f := range sc.Flows {
			if f.Bucket() != b.Bucket() {
				continue
			}
			for bin := range n {
				for k := range steps {
					t := time.Duration(bin)*Bin + time.Duration(k)*sc.Step
					b.Nominal[bin] += float64(f.Rate.At(t) * sc.Step.Seconds())
					if cost != nil {
						cost[bin] += f.Rate.At(t) * sc.Step.Seconds() * CostAt(svc, &f, t)
					}
				}
			}
		}
		if cost != nil {
			if b.Cost == nil {
				b.Cost = &CostSeries{}
			}
			b.Cost.Nominal, b.Cost.Allowed = cost, make([]float64, n)
		}
		c := callees[b.Callee]
		if c == nil {
			c = &callee{}
			callees[b.Callee] = c
			order = append(order, b.Callee)
		}
		c.leaves = append(c.leaves, b.Bucket())
		c.idx = append(c.idx, i)
	}
	defer func() {
		for i := range buckets {
			burst(sc.Limits.Service(buckets[i].Callee), &buckets[i])
		}
	}()
	for _, name := range order {
		c := callees[name]
		svc := sc.Limits.Service(name)
		nominal := make([]float64, len(c.idx))
		for bin := range buckets[c.idx[0]].Nominal {
			for j, i := range c.idx {
				if bin < len(buckets[i].Nominal) {
					nominal[j] = buckets[i].Nominal[bin]
					if svc.Counted() {
						nominal[j] = buckets[i].Cost.Nominal[bin]
					}
				}
			}
			allowed := AllowedLeaves(sc.oracleService(svc, name, bin), c.leaves, nominal)
			for j, i := range c.idx {
				if bin >= len(buckets[i].Allowed) {
					continue
				}
				b := &buckets[i]
				if !svc.Counted() {
					b.Allowed[bin] = allowed[j]
					continue
				}
				// In requests: the allowed cost at the nominal cost of a request.
				b.Cost.Allowed[bin] = allowed[j]
				b.Allowed[bin] = math.Inf(1)
				if nc := b.Cost.Nominal[bin]; nc > 0 {
					b.Allowed[bin] = allowed[j] * b.Nominal[bin] / nc
				}
			}
		}
	}
}

// Allowed is the simulator's oracle: for each caller of one callee, the rate
// it may send given what every caller offers — min(its limit, its max-min
// fair share of the callee's capacity). It is written from that definition
// and shares no code with the control law (pkg/dropratio), so that the law
// is measured against it rather than against itself.
//
// The fair share is computed by water-filling in rounds: split what is left
// of the capacity evenly over the callers not yet satisfied; every caller
// whose demand, min(offered, limit), fits in that split is satisfied and
// leaves the rest to the others; when none fits, the split is the level.
// While the demands fit in the capacity there is no level and each caller
// may send up to its limit.
//
// svc may be nil (no limits: everything is allowed); a caller without a
// limit of its own takes the service's default. +Inf means unbounded.
func Allowed(svc *limits.Service, callers []string, offered []float64) []float64 {
	out := make([]float64, len(callers))
	demand := make([]float64, len(callers))
	total := 0.0
	for i, c := range callers {
		out[i] = svc.Bucket(c).Limit
		demand[i] = math.Min(math.Max(offered[i], 0), out[i])
		total += demand[i]
	}
	if svc == nil || math.IsInf(svc.Capacity, 1) || total <= svc.Capacity {
		return out
	}
	level := fairLevel(demand, svc.Capacity)
	for i := range out {
		out[i] = math.Min(out[i], level)
	}
	return out
}

// fairLevel returns the max-min fair level of capacity over demands that do
// not fit in it.
func fairLevel(demand []float64, capacity float64) float64 {
	satisfied := make([]bool, len(demand))
	left, open := capacity, len(demand)
	for open > 0 {
		share := left / float64(open)
		progress := false
		for i, d := range demand {
			if !satisfied[i] && d <= share {
				satisfied[i] = true
				left -= d
				open--
				progress = true
			}
		}
		if !progress {
			return share
		}
	}
	return math.Inf(1) // everything fitted after all
}

// AllowedLeaves is Allowed for the buckets of one callee, which may be
// leaves (caller, procedure): for a callee that declares procedures it
// follows the hierarchical law's rules (docs/architecture.md, "The
// hierarchical law"), written from them with Allowed's water-filling and
// sharing no code with pkg/dropratio's Filler:
//
//  1. each leaf demands d = min(offered, its own limit L_cp); a caller whose
//     leaves demand more than its limit across procedures L_c has L_c
//     shared max-min fairly among them, at level λ_c, and each demands
//     d' = min(d, λ_c) from then on;
//  2. each procedure demands D_p = min(C_p, Σ d' of its leaves); the
//     callee's capacity is shared max-min fairly among the procedures by
//     D_p, and each procedure's share among its leaves by d', at level ν_p.
//
// A leaf may send min(L_cp, λ_c, ν_p), with L_c standing for λ_c while its
// caller's leaves fit in it, and +Inf for a level that does not bind. So a
// leaf whose offered rate is within that rate is within every level of its
// limits: a drop of it is collateral. Only the callee's buckets with a flow
// are leaves here, as only leaves with traffic weigh in the law.
func AllowedLeaves(svc *limits.Service, leaves []Bucket, offered []float64) []float64 {
	if !svc.HasProcedures() {
		callers := make([]string, len(leaves))
		for i, l := range leaves {
			callers[i] = l.Caller
		}
		return Allowed(svc, callers, offered)
	}
	byCaller, byProc := map[string][]int{}, map[string][]int{}
	var callers, procs []string // in order of first appearance: the levels do not depend on it
	demand := make([]float64, len(leaves))
	out := make([]float64, len(leaves))
	for i, l := range leaves {
		out[i] = svc.LeafLimit(l.Caller, l.Procedure)
		demand[i] = math.Min(math.Max(offered[i], 0), out[i])
		if byCaller[l.Caller] == nil {
			callers = append(callers, l.Caller)
		}
		if byProc[l.Procedure] == nil {
			procs = append(procs, l.Procedure)
		}
		byCaller[l.Caller] = append(byCaller[l.Caller], i)
		byProc[l.Procedure] = append(byProc[l.Procedure], i)
	}
	// 1. The caller limits, bottom-up.
	for _, c := range callers {
		idx := byCaller[c]
		limit := svc.Bucket(c).Limit
		level := levelOf(demand, idx, limit)
		for _, i := range idx {
			out[i] = math.Min(out[i], math.Min(limit, level))
			demand[i] = math.Min(demand[i], level)
		}
	}
	// 2. The capacities, top-down.
	procDemand := make([]float64, len(procs))
	for j, p := range procs {
		for _, i := range byProc[p] {
			procDemand[j] += demand[i]
		}
		procDemand[j] = math.Min(procDemand[j], svc.ProcedureCapacity(p))
	}
	mu := levelOf(procDemand, nil, svc.Capacity)
	for j, p := range procs {
		nu := levelOf(demand, byProc[p], math.Min(procDemand[j], mu))
		for _, i := range byProc[p] {
			out[i] = math.Min(out[i], nu)
		}
	}
	return out
}

// levelOf is the max-min fair level of capacity over the demands at idx
// (all of them when idx is nil): +Inf when they fit in it.
func levelOf(demand []float64, idx []int, capacity float64) float64 {
	var ds []float64
	if idx == nil {
		ds = demand
	} else {
		ds = make([]float64, len(idx))
		for j, i := range idx {
			ds[j] = demand[i]
		}
	}
	total := 0.0
	for _, d := range ds {
		total += d
	}
	if math.IsInf(capacity, 1) || total <= capacity {
		return math.Inf(1)
	}
	return fairLevel(ds, capacity)
}

// burst raises the allowed rate of a caller whose limit allows a burst
// (issue #17) by the tokens its own bucket holds, second by second: full
// at the start, filled by what its nominal rate leaves of its limit,
// spent by what it sends above it. Written from the definition, not with
// pkg/dropratio. A second in which a capacity holds the caller under its
// limit spends and fills nothing; leaves and cost callers are left as
// they are (the limits give neither a burst).
func burst(svc *limits.Service, b *BucketSeries) {
	lb := svc.Bucket(b.Caller)
	if lb.Burst <= 0 || b.Procedure != "" || b.Cost != nil {
		return
	}
	tokens := lb.Burst
	for bin := range b.Allowed {
		if bin >= len(b.Nominal) || b.Allowed[bin] < lb.Limit {
			continue
		}
		b.Allowed[bin] = lb.Limit + tokens
		sent := min(b.Nominal[bin], b.Allowed[bin])
		tokens = min(max(tokens+lb.Limit-sent, 0), lb.Burst)
	}
}
