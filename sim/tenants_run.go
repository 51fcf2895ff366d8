package sim

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/sidecar"
)

// tenantRun is a run's tenant traffic: the population, the oracle, and
// the callee's sidecars the requests go to.
type tenantRun struct {
	pop      *tenantPop
	oracle   *tenantOracle
	sidecars []*simSidecar
	caller   string
	// requests counts the Decide (and DecideDescriptor) calls made for
	// the tenants.
	requests int64
	listed   int // the most values a policy listed for the descriptor
}

func (e *engine) newTenantRun() {
	t := e.sc.Tenants
	if t == nil {
		return
	}
	c := e.callees[e.calleeIndex(t.Callee)]
	pop := newTenantPop(t, len(c.sidecars), e.rng)
	e.tenants = &tenantRun{pop: pop, oracle: newTenantOracle(pop, e.nbins), sidecars: c.sidecars, caller: t.Caller}
}

// offerTenants draws one traffic step's tenant requests and decides each.
// The Zipf population's arrivals are Poisson with the total rate, each
// drawn's tenant from the alias table: the cost per request does not grow
// with the number of tenants. An abuser's Zipf draws are thinned out once
// it abuses; it sends its own Poisson arrivals instead.
func (e *engine) offerTenants() {
	tr := e.tenants
	if tr == nil {
		return
	}
	t, pop := e.now, tr.pop
	abusing := t >= pop.t.AbuseFrom
	for range poisson(e.rng, pop.t.Rate*e.stepSec) {
		i := pop.zipf.Draw(e.rng)
		if abusing && pop.abuse[i] >= 0 {
			continue
		}
		e.tenantRequest(i)
	}
	if !abusing {
		return
	}
	for _, i := range pop.abusers {
		for range poisson(e.rng, pop.rate(int(i), t)*e.stepSec) {
			e.tenantRequest(int(i))
		}
	}
}

// tenantRequest sends one request of tenant rank i to its sidecar, which
// decides it as the HTTP middleware does: the bucket first, then the
// descriptor's value if the bucket admitted it.
func (e *engine) tenantRequest(i int) {
	tr := e.tenants
	var s *simSidecar
	if p := tr.pop.pin[i]; p >= 0 {
		s = tr.sidecars[p]
	} else {
		s = tr.sidecars[e.rng.IntN(len(tr.sidecars))]
	}
	d := s.svc.Decide(tr.caller)
	if !d.Drop && s.desc >= 0 {
		d = s.svc.DecideDescriptor(s.desc, tr.pop.name(i))
	}
	tr.oracle.count(i, !d.Drop)
	tr.requests++
}

// installed notes that s now holds policy p (nil: none): the index of the
// tenants' descriptor in it, which DecideDescriptor takes.
func (e *engine) installed(s *simSidecar, p *sidecar.Policy) {
	s.desc = -1
	tr := e.tenants
	if tr == nil || p == nil || e.callees[s.callee].svc.Name != tr.pop.t.Callee {
		return
	}
	for i, d := range p.Descriptors {
		if d.Name == tr.pop.t.Descriptor {
			s.desc = i
			tr.listed = max(tr.listed, len(d.Values))
		}
	}
}

// endTenantSecond folds second bin into the oracle's totals.
func (e *engine) endTenantSecond(bin int) {
	if e.tenants != nil && bin >= 0 && bin < e.nbins {
		e.tenants.oracle.endSecond(bin)
	}
}

func (e *engine) tenantResult() *TenantResult {
	if e.tenants == nil {
		return nil
	}
	r := e.tenants.oracle.result()
	r.Requests = e.tenants.requests
	r.Resources.Listed = e.tenants.listed
	r.Resources.SketchBytes = e.sketchBytes()
	return r
}

// sketchBytes reads one of the tenants' sidecars' descriptor sketch memory
// from its metrics, as an operator would read
// sluice_sidecar_descriptor_sketch_bytes; 0 if it reports none.
func (e *engine) sketchBytes() int {
	tr := e.tenants
	reg := prometheus.NewRegistry()
	if err := reg.Register(tr.sidecars[0].lim.Collector()); err != nil {
		e.fail(fmt.Errorf("register a sidecar's metrics: %w", err))
		return 0
	}
	mfs, err := reg.Gather()
	if err != nil {
		e.fail(fmt.Errorf("gather a sidecar's metrics: %w", err))
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != sketchBytesMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "descriptor" && l.GetValue() == tr.pop.t.Descriptor {
					return int(m.GetGauge().GetValue())
				}
			}
		}
	}
	return 0
}

const sketchBytesMetric = "sluice_sidecar_descriptor_sketch_bytes"
