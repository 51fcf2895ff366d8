package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// FlowSeries is the per-second series of one flow that carries a
// criticality (issue #16): what its requests offered and what the
// sidecars admitted, and what the law allows it (Allowed, from
// ExpectFlows). Bins are Bin wide.
type FlowSeries struct {
	Flow           int // index in Scenario.Flows
	Callee, Caller string
	// Header is the criticality the flow's requests carry; Tier the tier
	// the callee's sidecars give them (the header capped by the caller's
	// maximum).
	Header            string
	Tier              criticality.Tier
	Offered, Admitted []float64 // requests per bin, retries included
	Nominal, Allowed  []float64 // per bin: the flow's rate, and what the law allows it
	// Ratio is the drop ratio the callee's sidecars held for the flow's
	// leaf (caller, procedure, tier) at the end of each bin, mean over
	// them (LeafTierRatio).
	Ratio []float64
}

// Tiered reports whether a flow of the scenario carries a criticality.
func (s *Scenario) Tiered() bool {
	for _, f := range s.Flows {
		if f.Criticality != "" {
			return true
		}
	}
	return false
}

// FlowTier is the tier the callee's sidecars give the flow's requests: its
// header, capped by the caller's maximum (else the service's), or the
// most specific default when it carries none. None at an untiered callee.
func FlowTier(svc *limits.Service, f *Flow) criticality.Tier {
	if !svc.Tiered() {
		return criticality.None
	}
	t, ok := criticality.Parse(f.Criticality)
	if !ok {
		return svc.DefaultTier(f.Caller, f.Leaf)
	}
	t, _ = criticality.Cap(t, svc.MaxTier(f.Caller))
	return t
}

func (e *engine) initFlowSeries() {
	if !e.sc.Tiered() {
		return
	}
	e.flowIdx = make([]int, len(e.sc.Flows))
	for fi := range e.sc.Flows {
		f := &e.sc.Flows[fi]
		e.flowIdx[fi] = -1
		if f.Criticality == "" {
			continue
		}
		e.flowIdx[fi] = len(e.flowSeries)
		e.flowSeries = append(e.flowSeries, FlowSeries{
			Flow: fi, Callee: f.Callee, Caller: f.Caller, Header: f.Criticality,
			Tier:    FlowTier(e.sc.Limits.Service(f.Callee), f),
			Offered: make([]float64, e.nbins), Admitted: make([]float64, e.nbins),
			Ratio: make([]float64, e.nbins),
		})
	}
}

// tieredBucket reports whether every flow of the bucket carries a
// criticality: the tier oracle (ExpectFlows) then gives its allowed rate,
// and no Pipeline follows it, since the pipeline's stages compare against
// the untiered per-caller oracle.
func (e *engine) tieredBucket(bs *bucketState) bool {
	if e.flowIdx == nil || len(bs.flows) == 0 {
		return false
	}
	for _, fi := range bs.flows {
		if e.flowIdx[fi] < 0 {
			return false
		}
	}
	return true
}

func (e *engine) flowAdd(flow, bin, offered, admitted int) {
	if e.flowIdx == nil || e.flowIdx[flow] < 0 || bin >= e.nbins {
		return
	}
	fs := &e.flowSeries[e.flowIdx[flow]]
	fs.Offered[bin] += float64(offered)
	fs.Admitted[bin] += float64(admitted)
}

// ExpectFlows sets the Nominal and Allowed series of the tiered flows: per
// second, every callee's tiered flows go through the law's own Filler
// (pkg/dropratio) as leaves (caller, procedure, tier), with the callee's
// capacity, procedure capacities and caller limits; flows that share a
// leaf share its allowed rate in proportion to their rates.
func ExpectFlows(sc *Scenario, flows []FlowSeries) {
	if len(flows) == 0 {
		return
	}
	steps := int(Bin / sc.Step)
	for i := range flows {
		fs := &flows[i]
		f := &sc.Flows[fs.Flow]
		n := len(fs.Offered)
		fs.Nominal = make([]float64, n)
		fs.Allowed = make([]float64, n)
		for bin := range n {
			for k := range steps {
				t := time.Duration(bin)*Bin + time.Duration(k)*sc.Step
				fs.Nominal[bin] += f.Rate.At(t) * sc.Step.Seconds()
			}
		}
	}
	type leafKey struct {
		caller, proc string
		tier         criticality.Tier
	}
	var filler dropratio.Filler
	for _, callee := range sc.Callees() {
		svc := sc.Limits.Service(callee)
		var idx []int
		for i := range flows {
			if flows[i].Callee == callee {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		keys := map[leafKey]int{}
		var tree dropratio.Tree
		tree.Capacity = math.Inf(1)
		if svc != nil {
			tree.Capacity = svc.Capacity
		}
		leafOf := make([]int, len(idx))
		seenCaller, seenProc := map[string]bool{}, map[string]bool{}
		for j, i := range idx {
			f := &sc.Flows[flows[i].Flow]
			k := leafKey{f.Caller, f.Leaf, flows[i].Tier}
			l, ok := keys[k]
			if !ok {
				l = len(tree.Leaves)
				keys[k] = l
				limit := svc.Bucket(f.Caller).Limit
				if svc.HasProcedures() {
					limit = math.Min(limit, svc.LeafLimit(f.Caller, f.Leaf))
				}
				tree.Leaves = append(tree.Leaves, dropratio.Leaf{Caller: f.Caller, Procedure: f.Leaf, Tier: uint8(k.tier), Limit: limit})
			}
			leafOf[j] = l
			if svc.HasProcedures() && !seenCaller[f.Caller] {
				seenCaller[f.Caller] = true
				tree.Callers = append(tree.Callers, dropratio.CallerLimit{Name: f.Caller, Limit: svc.Bucket(f.Caller).Limit})
			}
			if svc.HasProcedures() && !seenProc[f.Leaf] {
				seenProc[f.Leaf] = true
				tree.Procedures = append(tree.Procedures, dropratio.Procedure{Name: f.Leaf, Capacity: svc.ProcedureCapacity(f.Leaf)})
			}
		}
		for bin := range flows[idx[0]].Nominal {
			if o := sc.oracleService(svc, callee, bin); o != nil {
				tree.Capacity = o.Capacity // a modelled callee's knee may change
			}
			for l := range tree.Leaves {
				tree.Leaves[l].Offered = 0
			}
			for j, i := range idx {
				tree.Leaves[leafOf[j]].Offered += flows[i].Nominal[bin]
			}
			shares := filler.Fill(&tree)
			for j, i := range idx {
				lf := &tree.Leaves[leafOf[j]]
				a := math.Min(shares[leafOf[j]].Allowed, lf.Offered)
				if lf.Offered > 0 {
					a *= flows[i].Nominal[bin] / lf.Offered
				}
				flows[i].Allowed[bin] = a
			}
		}
	}
}

// expectTieredBuckets makes the oracle of a bucket whose flows all carry a
// criticality the tiers' own: its Allowed is the sum of what the law
// allows its flows (each at most its rate), per second.
func expectTieredBuckets(sc *Scenario, buckets []BucketSeries, flows []FlowSeries) {
	for i := range buckets {
		b := &buckets[i]
		mine := tierFlowsOf(sc, b.Bucket(), flows)
		if mine == nil {
			continue
		}
		for bin := range b.Allowed {
			b.Allowed[bin] = 0
			for _, j := range mine {
				b.Allowed[bin] += flows[j].Allowed[bin]
			}
		}
	}
}

// tierFlowsOf returns the indexes in flows of the bucket's flows when
// every one carries a criticality; nil when one does not, or it has none.
func tierFlowsOf(sc *Scenario, bucket Bucket, flows []FlowSeries) []int {
	var mine []int
	for fi := range sc.Flows {
		if sc.Flows[fi].Bucket() != bucket {
			continue
		}
		j := slices.IndexFunc(flows, func(fs FlowSeries) bool { return fs.Flow == fi })
		if j < 0 {
			return nil
		}
		mine = append(mine, j)
	}
	return mine
}

// TieredBucket reports whether every flow of r's bucket i carries a
// criticality: its allowed rate is then the sum of what the law allows its
// tiers, and no Pipeline follows it.
func (r *Result) TieredBucket(i int) bool {
	return tierFlowsOf(r.Scenario, r.Buckets[i].Bucket(), r.Flows) != nil
}

// TierSettle is how long after the start of each phase the tier measures
// leave the loop to react: the seconds [phase start, start + TierSettle)
// are not judged, and in the first phase neither are the controller's
// warm-up (during which it publishes nothing) and TierSettle after it.
const TierSettle = 5 * time.Second

// Phase is a stretch of a tiered scenario between two changes of a tiered
// flow's rate; the measures judge [Settled, To).
type Phase struct {
	From, Settled, To time.Duration
}

// Judged returns the first and the end bin the measures judge.
func (p Phase) Judged() (from, to int) {
	return int(p.Settled / Bin), int(p.To / Bin)
}

// TierMeasures are the measures of a scenario's tiered flows, per phase.
type TierMeasures struct {
	Phases []Phase
	Flows  []TierFlow
	// Callees holds, per tiered callee, its capacity and what all its
	// tiered flows offered and admitted, per phase, in rps.
	Callees []TierCallee
}

// TierFlow is one tiered flow's measures, per phase, in rps over the
// phase's judged seconds.
type TierFlow struct {
	Callee, Caller, Header string
	Tier                   criticality.Tier
	Offered, Admitted      []float64
	Allowed                []float64 // the oracle's, min(allowed, nominal)
	Loss                   []float64 // 1 − admitted/offered
}

// TierCallee is a tiered callee's totals per phase.
type TierCallee struct {
	Name string
	// Capacity is the one the oracle shares, per phase: the written one,
	// or at a modelled callee with an objective the fleet's knee, averaged
	// over the judged seconds.
	Capacity          []float64
	Offered, Admitted []float64
}

// TierPhases splits the run at every change of a tiered flow's rate
// (steps and ramp points after 0s), and at every brownout's start and end.
func TierPhases(sc *Scenario) []Phase {
	cuts := []time.Duration{0}
	for i := range sc.Events {
		if ev := &sc.Events[i]; ev.Kind == Brownout {
			cuts = append(cuts, ev.At)
			if end := ev.End(sc.Duration); end < sc.Duration {
				cuts = append(cuts, end)
			}
		}
	}
	for _, f := range sc.Flows {
		if f.Criticality == "" {
			continue
		}
		for _, p := range f.Rate.Points {
			if p.At > 0 && p.At < sc.Duration {
				cuts = append(cuts, p.At)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []Phase
	for i, c := range cuts {
		end := sc.Duration
		if i+1 < len(cuts) {
			end = cuts[i+1]
		}
		settled := c + TierSettle
		if i == 0 {
			settled = max(c, sc.Loop.Controller.Warmup) + TierSettle
		}
		out = append(out, Phase{From: c, Settled: min(settled, end), To: end})
	}
	return out
}

// MeasureTiers returns the measures of r's tiered flows; nil when it has
// none.
func MeasureTiers(r *Result) *TierMeasures {
	if len(r.Flows) == 0 {
		return nil
	}
	sc := r.Scenario
	m := &TierMeasures{Phases: TierPhases(sc)}
	np := len(m.Phases)
	mean := func(v []float64, p Phase) float64 {
		from, to := p.Judged()
		to = min(to, len(v))
		if to <= from {
			return 0
		}
		s := 0.0
		for _, x := range v[from:to] {
			s += x
		}
		return s / float64(to-from) / Bin.Seconds()
	}
	callees := map[string]int{}
	for _, fs := range r.Flows {
		tf := TierFlow{Callee: fs.Callee, Caller: fs.Caller, Header: fs.Header, Tier: fs.Tier,
			Offered: make([]float64, np), Admitted: make([]float64, np), Allowed: make([]float64, np), Loss: make([]float64, np)}
		ci, ok := callees[fs.Callee]
		if !ok {
			ci = len(m.Callees)
			callees[fs.Callee] = ci
			capacity := make([]float64, np)
			svc := sc.Limits.Service(fs.Callee)
			for p, ph := range m.Phases {
				capacity[p] = math.Inf(1)
				from, to := ph.Judged()
				if svc == nil || to <= from {
					continue
				}
				sum := 0.0
				for bin := from; bin < to; bin++ {
					sum += sc.oracleService(svc, fs.Callee, bin).Capacity
				}
				capacity[p] = sum / float64(to-from)
			}
			m.Callees = append(m.Callees, TierCallee{Name: fs.Callee, Capacity: capacity, Offered: make([]float64, np), Admitted: make([]float64, np)})
		}
		for p, ph := range m.Phases {
			tf.Offered[p] = mean(fs.Offered, ph)
			tf.Admitted[p] = mean(fs.Admitted, ph)
			tf.Allowed[p] = mean(fs.Allowed, ph)
			if tf.Offered[p] > 0 {
				tf.Loss[p] = 1 - tf.Admitted[p]/tf.Offered[p]
			}
			m.Callees[ci].Offered[p] += tf.Offered[p]
			m.Callees[ci].Admitted[p] += tf.Admitted[p]
		}
		m.Flows = append(m.Flows, tf)
	}
	slices.SortStableFunc(m.Flows, func(a, b TierFlow) int {
		return cmp.Or(strings.Compare(a.Callee, b.Callee), cmp.Compare(a.Tier, b.Tier), strings.Compare(a.Caller, b.Caller))
	})
	return m
}

// writeTiers writes the tiered flows' table, per phase.
func writeTiers(b *strings.Builder, m *TierMeasures) {
	b.WriteString("\ncriticality tiers (rps, mean over each phase's judged seconds: the first " + TierSettle.String() + " of a phase, and of the run after the controller's warm-up, are the loop's to react; law: what the law allows the flow):\n")
	for p, ph := range m.Phases {
		from, to := ph.Judged()
		fmt.Fprintf(b, "  phase %d: %v–%v, judged %ds–%ds\n", p+1, ph.From, ph.To, from, to)
		fmt.Fprintf(b, "    %-26s %-15s %9s %9s %9s %8s\n", "flow", "tier", "offered", "admitted", "law", "loss")
		for _, f := range m.Flows {
			name := f.Callee + "/" + f.Caller
			fmt.Fprintf(b, "    %-26s %-15s %9s %9s %9s %8s\n", name, f.Tier, rate(f.Offered[p]), rate(f.Admitted[p]), rate(f.Allowed[p]), pct(f.Loss[p]))
		}
		for _, c := range m.Callees {
			dev := math.NaN()
			if c.Capacity[p] > 0 && !math.IsInf(c.Capacity[p], 1) {
				dev = c.Admitted[p]/c.Capacity[p] - 1
			}
			fmt.Fprintf(b, "    %s: offered %s, admitted %s of capacity %s (%s)\n", c.Name, rate(c.Offered[p]), rate(c.Admitted[p]), rate(c.Capacity[p]), signedPct(dev))
		}
	}
}
