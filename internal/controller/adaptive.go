package controller

import (
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/adaptive"
)

// Capacity from an objective (issue #18): a callee whose limits declare
// slo: {latency_p99, errors} gets a capacity estimated each tick by its
// own adaptive.Estimator from the fleet's view of it (what its sidecars
// admitted, health.go's p99 and error ratio), and the law shares the
// smaller of that and a written capacity as it shares any capacity: by
// tier first, max-min fairly within one (DESIGN.md, "The bucket,
// widened"). Until the estimator has seen the callee answer, the
// objective does not bind.

// objectiveSettle is how long an estimator waits after a decrease before
// it decreases again (adaptive.Config.Settle): the health a tick reads
// was reported over the window before the sidecars had the policy of the
// last tick, so a decrease shows a tick and a report window later, two
// seconds at the defaults. Without it, a callee offered twice its knee
// (TestAdaptiveCapacityAsProcesses) was cut to a fifth of its knee, and
// its critical caller lost 7 %.
const objectiveSettle = 2 * time.Second

// objectiveMinDecrease is the deepest single decrease of an estimate
// (adaptive.Config.MinDecrease). The law gives a shed caller its share
// back at most doubling it a second (dropratio.Config.ReleaseRate), so a
// cut to half the goodput, the model's default, left a callee offered
// twice its knee under 80 % of it for four seconds after the estimate had
// recovered; 0.7 drains the queue the overload built about as fast, in
// the test's knee, and costs a third of that.
const objectiveMinDecrease = 0.7

// estimatorFor returns the estimator of k (a callee, or one of its
// procedures) under objective obj, made anew when the objective changed
// (what it remembered was measured against the old one).
func (s *State) estimatorFor(k ServiceProcedure, obj adaptive.Objective) *adaptive.Estimator {
	if e := s.estimators[k]; e != nil && s.objectives[k] == obj {
		return e
	}
	cfg := adaptive.DefaultConfig(obj)
	cfg.Settle = objectiveSettle
	cfg.MinDecrease = objectiveMinDecrease
	e, err := adaptive.New(cfg)
	if err != nil {
		return nil // limits.Parse validated obj; a hand-built Set may not have
	}
	if s.estimators == nil {
		s.estimators, s.objectives = map[ServiceProcedure]*adaptive.Estimator{}, map[ServiceProcedure]adaptive.Objective{}
	}
	s.estimators[k], s.objectives[k] = e, obj
	return e
}

// stepEstimates steps the estimator of every callee and procedure with an
// objective, dt after the last tick, and returns the estimates: a
// callee's under its name with Procedure "", a procedure's under both
// names. Those whose limits dropped their objective forget theirs.
//
// A procedure's sample is its own leaves' load (folded as the law folds
// them: a procedure the callee does not declare is names.Other) and its
// own health, which the sidecars report per declared procedure.
func (s *State) stepEstimates(dt time.Duration, inbound map[string][]peerTotals, hs map[ServiceProcedure]UpstreamHealth, set *limits.Set) map[ServiceProcedure]adaptive.Estimate {
	var out map[ServiceProcedure]adaptive.Estimate
	step := func(k ServiceProcedure, obj adaptive.Objective) {
		e := s.estimatorFor(k, obj)
		if e == nil {
			return
		}
		var offered, dropped float64
		for _, p := range inbound[k.Service] {
			if k.Procedure == "" || p.procedure == k.Procedure {
				offered += p.Offered
				dropped += p.Dropped
			}
		}
		h, ok := hs[k]
		sample := adaptive.Sample{Offered: offered, Admitted: max(offered-dropped, 0), Goodput: h.OK, P99: h.P99, Errors: h.Errors(), InFlight: h.InFlight}
		dt := dt
		if !ok || !h.HasP99 {
			dt = 0 // nothing measured: the estimate holds
		}
		if out == nil {
			out = map[ServiceProcedure]adaptive.Estimate{}
		}
		out[k] = e.Step(dt, sample)
	}
	for _, name := range set.Services() {
		lim := set.Service(name)
		if lim.SLO != (adaptive.Objective{}) {
			step(ServiceProcedure{name, ""}, lim.SLO)
		}
		// Each estimator steps on its own: the order does not matter.
		for proc, p := range lim.Procedures {
			if p.SLO != (adaptive.Objective{}) {
				step(ServiceProcedure{name, proc}, p.SLO)
			}
		}
	}
	for k := range s.estimators {
		if _, ok := out[k]; !ok {
			delete(s.estimators, k)
			delete(s.objectives, k)
		}
	}
	return out
}

// capacityOf is the capacity the law shares for k, a callee (Procedure
// "") or one of its procedures: its written capacity, capped by the
// estimate from its objective when there is one. An estimate of 0 (none
// yet) does not bind.
func capacityOf(k ServiceProcedure, written float64, est map[ServiceProcedure]adaptive.Estimate) float64 {
	if e, ok := est[k]; ok && e.Capacity > 0 {
		return min(written, e.Capacity)
	}
	return written
}
