package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/testkit/knee"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/sidecar"
)

// A modelled callee (issue #18). In deterministic mode a callee is not an
// app: nothing answers the requests its sidecars admit. A scenario may
// give it one, a knee (Service.Knee), and brownouts that change it for a
// while (Event Brownout):
//
//	services:
//	  api:
//	    sidecars: {zone-a: 10}
//	    knee: {workers: 8, service: 20ms, queue: 40}   # per instance: 400 rps
//	events:
//	  - {at: 30s, brownout: {callee: api, workers: 4, for: 30s}}
//
// Each sidecar fronts one instance, as a sidecar fronts its pod: its own
// knee.Sim, fed the requests that sidecar admitted each traffic step. One
// model per sidecar rather than one per callee fed the fleet's sum: it is
// the production topology, so each sidecar's report carries its own
// instance's latency, queue and 503s, and the aggregators and the
// controller sum reports that differ as real ones do (one instance's
// Poisson share runs its queue longer than another's). The sidecar counts
// what its instance answered as its health.Recorder would count it (every
// answer in a latency bucket; a 503, answered at once, in the first), in
// whole requests: the fluid model's fractions carry over to the next
// report, so none is lost.

// Bounds of a scenario's knee.
const (
	maxKneeWorkers = 1_000_000
	maxKneeService = time.Minute
	maxKneeQueue   = 1_000_000_000
)

func buildKnee(fk *fileKnee, path string, bad func(string, string, ...any)) *knee.Config {
	k := &knee.Config{Workers: deref(fk.Workers, 0), Service: derefDuration(fk.Service, 0), Queue: deref(fk.Queue, 0)}
	if fk.Workers == nil {
		bad(path+".workers", "missing")
	} else if k.Workers < 1 || k.Workers > maxKneeWorkers {
		bad(path+".workers", "%d is outside [1, %d]", k.Workers, maxKneeWorkers)
	}
	if fk.Service == nil {
		bad(path+".service", "missing")
	} else if k.Service <= 0 || k.Service > maxKneeService {
		bad(path+".service", "%v is outside (0, %v]", k.Service, maxKneeService)
	}
	if k.Queue < 0 || k.Queue > maxKneeQueue {
		bad(path+".queue", "%d is outside [0, %d]", k.Queue, maxKneeQueue)
	}
	return k
}

// buildBrownout fills e from fb: the callee must be modelled; workers and
// service default to its own, and one of them must change.
func (sc *Scenario) buildBrownout(e *Event, fb *fileBrownout, path string, bad func(string, string, ...any)) {
	e.Callee = fb.Callee
	e.For = derefDuration(fb.For, 0)
	if e.For < 0 {
		bad(path+".for", "%v is negative", e.For)
	}
	svc := sc.Service(fb.Callee)
	switch {
	case fb.Callee == "":
		bad(path+".callee", "missing")
		return
	case svc == nil:
		bad(path+".callee", "%q is not in services", fb.Callee)
		return
	case svc.Knee == nil:
		bad(path+".callee", "service %s has no knee: a brownout changes a modelled callee", fb.Callee)
		return
	}
	e.Knee = *svc.Knee
	if fb.Workers == nil && fb.Service == nil {
		bad(path, "needs workers, service or both")
	}
	if fb.Workers != nil {
		e.Knee.Workers = *fb.Workers
		if e.Knee.Workers < 1 || e.Knee.Workers > maxKneeWorkers {
			bad(path+".workers", "%d is outside [1, %d]", e.Knee.Workers, maxKneeWorkers)
		}
	}
	if fb.Service != nil {
		e.Knee.Service = time.Duration(*fb.Service)
		if e.Knee.Service <= 0 || e.Knee.Service > maxKneeService {
			bad(path+".service", "%v is outside (0, %v]", e.Knee.Service, maxKneeService)
		}
	}
}

// checkModels checks what the modelled callees may not do yet, and that
// one callee's brownouts do not overlap (each ends with the callee's own
// knee back).
func (sc *Scenario) checkModels(bad func(string, string, ...any)) {
	for _, svc := range sc.Services {
		if svc.Knee == nil {
			continue
		}
		path := "services." + svc.Name + ".knee"
		if sc.Limits.Service(svc.Name).HasProcedures() {
			bad(path, "service %s declares procedures: a modelled callee's health is not split by procedure yet", svc.Name)
		}
		if sc.Tenants != nil && sc.Tenants.Callee == svc.Name {
			bad(path, "service %s is the tenants' callee: their requests are not fed to the model yet", svc.Name)
		}
	}
	end := map[string]time.Duration{}
	for i := range sc.Events {
		e := &sc.Events[i]
		if e.Kind != Brownout || e.Callee == "" {
			continue
		}
		if last, ok := end[e.Callee]; ok && e.At < last {
			bad(fmt.Sprintf("events (brownout of %s at %v)", e.Callee, e.At), "overlaps the one before, which ends at %v", last)
		}
		end[e.Callee] = e.End(sc.Duration)
	}
}

// KneeAt returns the shape of each instance of callee at t, its own or a
// brownout's; false when the callee is not modelled.
func (sc *Scenario) KneeAt(callee string, t time.Duration) (knee.Config, bool) {
	svc := sc.Service(callee)
	if svc == nil || svc.Knee == nil {
		return knee.Config{}, false
	}
	k := *svc.Knee
	for i := range sc.Events {
		e := &sc.Events[i]
		if e.Kind == Brownout && e.Callee == callee && t >= e.At && t < e.End(sc.Duration) {
			k = e.Knee
		}
	}
	return k, true
}

// ModelledCapacity returns the fleet's knee at t, what callee's instances
// can serve together: sidecars × workers ÷ service time. +Inf when the
// callee is not modelled.
func (sc *Scenario) ModelledCapacity(callee string, t time.Duration) float64 {
	k, ok := sc.KneeAt(callee, t)
	if !ok {
		return math.Inf(1)
	}
	n := 0
	for _, c := range sc.Service(callee).Sidecars {
		n += c
	}
	return float64(n) * k.Knee()
}

// oracleService is svc as the oracle shares it over the second bin: a
// callee that declares an objective (slo) and is modelled has the fleet's
// knee as its capacity (the smaller of it and a written one, averaged over
// the second's traffic steps), which a law that knew the knee would share.
// Any other is svc itself: without an objective the loop is not asked to
// find the knee.
func (sc *Scenario) oracleService(svc *limits.Service, callee string, bin int) *limits.Service {
	if svc == nil || svc.SLO == (adaptive.Objective{}) || sc.Service(callee).Knee == nil {
		return svc
	}
	steps := int(Bin / sc.Step)
	sum := 0.0
	for k := range steps {
		sum += sc.ModelledCapacity(callee, time.Duration(bin)*Bin+time.Duration(k)*sc.Step)
	}
	cp := *svc
	cp.Capacity = min(svc.Capacity, sum/float64(steps))
	return &cp
}

// upstream is one sidecar's instance of a modelled callee.
type upstream struct {
	sim *knee.Sim
	// ok and refused are the fluid answers since the start, ok by latency
	// bucket; took* are the whole requests of them already reported.
	ok          [health.Buckets]float64
	refused     float64
	tookOK      [health.Buckets]uint64
	tookRefused uint64
	inFlight    float64
}

func newUpstream(k knee.Config) (*upstream, error) {
	s, err := knee.NewSim(k)
	if err != nil {
		return nil, err
	}
	return &upstream{sim: s}, nil
}

// set gives the instance k's workers and service time from now on.
func (u *upstream) set(k knee.Config) {
	u.sim.SetWorkers(k.Workers)
	u.sim.SetService(k.Service)
}

// serve offers the instance rate requests per second for dt, and counts
// what it answered.
func (u *upstream) serve(dt time.Duration, rate float64) {
	tk := u.sim.Run(dt, rate)
	u.sim.Answered(func(d time.Duration, n float64) { u.ok[health.Bucket(d)] += n })
	u.refused += tk.Refused * dt.Seconds()
	u.inFlight = tk.InFlight
}

// take moves the whole answers not yet reported into c, as
// health.Recorder.Take does.
func (u *upstream) take(c *health.Counts) {
	*c = health.Counts{}
	for i := range c.Latency {
		n := uint64(u.ok[i]) - u.tookOK[i]
		u.tookOK[i] += n
		c.Latency[i] += n
		c.OK += n
	}
	f := uint64(u.refused) - u.tookRefused
	u.tookRefused += f
	c.Failed = f
	c.Latency[health.Bucket(0)] += f // a 503 is answered at once
	c.InFlight = uint32(min(math.Round(u.inFlight), math.MaxUint32))
}

// modelSource is the Source a modelled callee's sidecar hands its report
// Window: its Limiter, whose health is its instance's.
type modelSource struct {
	*sidecar.Limiter
	service string
	up      *upstream
}

// TakeHealth is reporter.HealthSource's: what the sidecar's instance
// answered since the last call, as one entry for the callee as a whole.
func (m *modelSource) TakeHealth(service string, dst []sidecar.HealthCounts) []sidecar.HealthCounts {
	if service != m.service {
		return m.Limiter.TakeHealth(service, dst)
	}
	var h sidecar.HealthCounts
	m.up.take(&h.Counts)
	if h.Answered() == 0 && h.InFlight == 0 {
		return dst
	}
	return append(dst, h)
}

// CapacitySeries is a modelled callee's knee and what the loop made of
// it, one entry per Bin.
type CapacitySeries struct {
	Callee string
	// Objective is the callee's slo; zero for none, and then the
	// controller estimates nothing.
	Objective adaptive.Objective
	// Knee is the fleet's knee (ModelledCapacity, averaged over the
	// second), rps.
	Knee []float64
	// Estimate is the capacity the controller estimated at its last tick
	// in the second (or before), rps; 0 before its first.
	Estimate []float64
	// P99, Errors and Goodput are what the controller read of the callee's
	// health at that tick: the fleet's p99 (0 when it had too few answers
	// to read one), the share of answers that failed, and the answers that
	// did not, rps.
	P99     []time.Duration
	Errors  []float64
	Goodput []float64
	// Admitted is what the callee's sidecars admitted, rps: the sum of its
	// buckets' Admitted.
	Admitted []float64
}

// modelState is what the engine keeps of a modelled callee between
// seconds.
type modelState struct {
	callee int
	series CapacitySeries
	// The controller's last reading.
	estimate, errors, goodput float64
	p99                       time.Duration
}

func (e *engine) initModels() {
	for ci, c := range e.callees {
		if c.svc.Knee == nil {
			continue
		}
		n := e.nbins
		m := &modelState{callee: ci, series: CapacitySeries{Callee: c.svc.Name, Knee: make([]float64, n),
			Estimate: make([]float64, n), P99: make([]time.Duration, n), Errors: make([]float64, n),
			Goodput: make([]float64, n), Admitted: make([]float64, n)}}
		if c.limits != nil {
			m.series.Objective = c.limits.SLO
		}
		e.models = append(e.models, m)
	}
}

// brownout gives every instance of callee the knee k: a brownout's, when
// it starts, or the callee's own, when it ends.
func (e *engine) brownout(callee string, k knee.Config, starts bool) {
	ci := e.calleeIndex(callee)
	for _, s := range e.callees[ci].sidecars {
		s.up.set(k)
	}
	what := "brownout over"
	if starts {
		what = "brownout"
	}
	e.noteCallee(callee, "%s: %s, each instance %d workers × %v (knee %s rps, the fleet's %s)",
		callee, what, k.Workers, k.Service, num(k.Knee()), num(e.sc.ModelledCapacity(callee, e.now)))
}

// readModels keeps what the controller's tick made of the modelled
// callees.
func (e *engine) readModels(res *controller.TickResult) {
	for _, m := range e.models {
		name := e.callees[m.callee].svc.Name
		if est, ok := res.Estimates[controller.ServiceProcedure{Service: name}]; ok {
			m.estimate = est.Capacity
		}
		if h, ok := res.Health[controller.ServiceProcedure{Service: name}]; ok {
			m.p99, m.errors, m.goodput = 0, h.Errors(), h.OK
			if h.HasP99 {
				m.p99 = h.P99
			}
		}
	}
}

// sampleModels records the controller's last reading for the second bin.
func (e *engine) sampleModels(bin int) {
	for _, m := range e.models {
		s := &m.series
		s.Estimate[bin], s.P99[bin], s.Errors[bin], s.Goodput[bin] = m.estimate, m.p99, m.errors, m.goodput
	}
}

// capacities returns the modelled callees' series, their knee and
// admitted rates filled in from the scenario and the buckets.
func (e *engine) capacities(buckets []BucketSeries) []CapacitySeries {
	var out []CapacitySeries
	steps := int(Bin / e.sc.Step)
	for _, m := range e.models {
		s := m.series
		for bin := range s.Knee {
			sum := 0.0
			for k := range steps {
				sum += e.sc.ModelledCapacity(s.Callee, time.Duration(bin)*Bin+time.Duration(k)*e.sc.Step)
			}
			s.Knee[bin] = sum / float64(steps)
		}
		for i := range buckets {
			if buckets[i].Callee != s.Callee {
				continue
			}
			for bin, a := range buckets[i].Admitted {
				s.Admitted[bin] += a
			}
		}
		out = append(out, s)
	}
	return out
}
