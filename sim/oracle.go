package sim

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// Expect fills in what the scenario expects of each series: Limit and
// Shadow from its limits, Nominal from its rate functions (averaged over
// each second at the scenario's step, as the simulator offers them), and
// Allowed from the oracle, given the nominal rates of all the callee's
// callers in that second. Only Offered's length is read; every series gets
// one entry per second of it. Live mode calls it on the series it measured,
// so that both modes are judged by the same yardstick.
func Expect(sc *Scenario, buckets []BucketSeries) {
	type callee struct {
		callers []string
		idx     []int // into buckets
	}
	callees := map[string]*callee{}
	var order []string
	for i := range buckets {
		b := &buckets[i]
		lb := sc.Limits.Service(b.Callee).Bucket(b.Caller)
		b.Limit, b.Shadow = lb.Limit, lb.Mode == dropratio.Shadow
		n := len(b.Offered)
		b.Nominal = make([]float64, n)
		b.Allowed = make([]float64, n)
		steps := int(Bin / sc.Step)
		for _, f := range sc.Flows {
			if f.Callee != b.Callee || f.Caller != b.Caller {
				continue
			}
			for bin := range n {
				for k := range steps {
					t := time.Duration(bin)*Bin + time.Duration(k)*sc.Step
					b.Nominal[bin] += float64(f.Rate.At(t) * sc.Step.Seconds())
				}
			}
		}
		c := callees[b.Callee]
		if c == nil {
			c = &callee{}
			callees[b.Callee] = c
			order = append(order, b.Callee)
		}
		c.callers = append(c.callers, b.Caller)
		c.idx = append(c.idx, i)
	}
	for _, name := range order {
		c := callees[name]
		svc := sc.Limits.Service(name)
		nominal := make([]float64, len(c.idx))
		for bin := range buckets[c.idx[0]].Nominal {
			for j, i := range c.idx {
				if bin < len(buckets[i].Nominal) {
					nominal[j] = buckets[i].Nominal[bin]
				}
			}
			allowed := Allowed(svc, c.callers, nominal)
			for j, i := range c.idx {
				if bin < len(buckets[i].Allowed) {
					buckets[i].Allowed[bin] = allowed[j]
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
