package controller

import (
	"math"
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

// estimatorFor returns name's estimator under objective obj, made anew
// when the objective changed (what it remembered was measured against the
// old one).
func (s *State) estimatorFor(name string, obj adaptive.Objective) *adaptive.Estimator {
	if e := s.estimators[name]; e != nil && s.objectives[name] == obj {
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
		s.estimators, s.objectives = map[string]*adaptive.Estimator{}, map[string]adaptive.Objective{}
	}
	s.estimators[name], s.objectives[name] = e, obj
	return e
}

// stepEstimates steps the estimator of every callee with an objective,
// dt after the last tick, and returns the estimates, by callee; callees
// whose limits dropped their objective forget theirs.
func (s *State) stepEstimates(dt time.Duration, inbound map[string][]peerTotals, hs map[ServiceProcedure]UpstreamHealth, set *limits.Set) map[string]adaptive.Estimate {
	var out map[string]adaptive.Estimate
	for _, name := range set.Services() {
		lim := set.Service(name)
		if lim.SLO == (adaptive.Objective{}) {
			continue
		}
		e := s.estimatorFor(name, lim.SLO)
		if e == nil {
			continue
		}
		var offered, dropped float64
		for _, p := range inbound[name] {
			offered += p.Offered
			dropped += p.Dropped
		}
		h, ok := hs[ServiceProcedure{name, ""}]
		sample := adaptive.Sample{Offered: offered, Admitted: max(offered-dropped, 0), Goodput: h.OK, P99: h.P99, Errors: h.Errors(), InFlight: h.InFlight}
		step := dt
		if !ok || !h.HasP99 {
			step = 0 // nothing measured: the estimate holds
		}
		if out == nil {
			out = map[string]adaptive.Estimate{}
		}
		out[name] = e.Step(step, sample)
	}
	for name := range s.estimators {
		if _, ok := out[name]; !ok {
			delete(s.estimators, name)
			delete(s.objectives, name)
		}
	}
	return out
}

// capacityOf is the capacity the law shares for callee name: its written
// capacity, or the estimate from its objective when that is smaller. An
// estimate of 0 (none yet) does not bind.
func capacityOf(name string, lim *limits.Service, est map[string]adaptive.Estimate) float64 {
	c := math.Inf(1)
	if lim != nil {
		c = lim.Capacity
	}
	if e, ok := est[name]; ok && e.Capacity > 0 {
		c = min(c, e.Capacity)
	}
	return c
}
