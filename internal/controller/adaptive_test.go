package controller

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/dataplane"
)

// sloLimits is search with an objective of p99 200ms and no capacity;
// web may send up to 1000 rps.
func sloLimits(obj adaptive.Objective) *limits.Set {
	inf := math.Inf(1)
	return limits.NewSet(map[string]*limits.Service{
		"search": {Name: "search", Capacity: inf, DefaultLimit: inf, FailMode: dataplane.FailOpen, SLO: obj,
			Callers: map[string]limits.Bucket{"web": {Limit: 1000}}},
	})
}

// TestCapacityFromObjective: a callee whose p99 blows past its objective
// once it is admitted more than its knee (100 rps) gets a capacity
// estimated near the knee within a few ticks, and web's ratio sheds the
// rest; without an objective the same health changes nothing.
func TestCapacityFromObjective(t *testing.T) {
	const knee, offered = 100.0, 300.0
	run := func(set *limits.Set) (TickResult, float64) {
		s := warmState(t)
		now := t0.Add(2 * time.Second)
		ratio := 0.0
		var res TickResult
		for range 8 {
			admitted := offered * (1 - ratio)
			p99 := 20 * time.Millisecond
			if admitted > knee {
				p99 = 800 * time.Millisecond
			}
			z := zoneLoad("a", "zone-a", 2, map[string]float64{"search/web": offered})
			z.Services[0].Peers[0].DroppedRps = offered - admitted
			z.Services[0].Health = []*sluicev1.HealthRates{hr("", math.Min(admitted, knee), 0, p99, p99)}
			if err := s.Apply(z, now); err != nil {
				t.Fatal(err)
			}
			res = s.Tick(now, set)
			if p := res.Changed["callee/search"]; p != nil {
				ratio = peer(p, "web").GetDropRatio()
			}
			now = now.Add(time.Second)
		}
		return res, ratio
	}

	res, ratio := run(sloLimits(adaptive.Objective{LatencyP99: 200 * time.Millisecond}))
	e, ok := res.Estimates[ServiceProcedure{"search", ""}]
	if !ok || e.Capacity < 0.8*knee || e.Capacity > 1.2*knee {
		t.Errorf("estimate %+v (ok %v), want within 20 %% of the knee %v", e, ok, knee)
	}
	if admitted := offered * (1 - ratio); admitted < 0.8*knee || admitted > 1.2*knee {
		t.Errorf("web admitted %.1f rps (ratio %.3f), want about the knee %v", admitted, ratio, knee)
	}
	if h := res.Health[ServiceProcedure{"search", ""}]; !h.HasP99 {
		t.Errorf("no p99 read: %+v", h)
	}

	res, ratio = run(sloLimits(adaptive.Objective{}))
	if len(res.Estimates) != 0 || ratio != 0 {
		t.Errorf("without an objective: estimates %v, ratio %v; want none and 0", res.Estimates, ratio)
	}
}

// TestObjectiveDoesNotBindUntilAnswered: a callee with an objective whose
// sidecars report no health yet is not limited by it.
func TestObjectiveDoesNotBindUntilAnswered(t *testing.T) {
	res := tickOnce(t, sloLimits(adaptive.Objective{Errors: 0.01}),
		zoneLoad("a", "zone-a", 2, map[string]float64{"search/web": 300}))
	if e := res.Estimates[ServiceProcedure{"search", ""}]; e.Capacity != 0 || e.Reason != adaptive.NoData {
		t.Errorf("estimate %+v, want none yet", e)
	}
	if r := peer(res.Changed["callee/search"], "web").GetDropRatio(); r != 0 {
		t.Errorf("web's ratio %v, want 0: no objective binds before the callee answered", r)
	}
}

// TestPolicyCarriesObjective: a callee's objective travels in its policy,
// for its sidecars' health fast path; a callee without one has none.
func TestPolicyCarriesObjective(t *testing.T) {
	res := tickOnce(t, sloLimits(adaptive.Objective{LatencyP99: 200 * time.Millisecond, Errors: 0.01}),
		zoneLoad("a", "zone-a", 2, map[string]float64{"search/web": 300}))
	o := res.Changed["callee/search"].GetObjective()
	if o.GetLatencyP99().AsDuration() != 200*time.Millisecond || o.GetErrors() != 0.01 {
		t.Errorf("the policy's objective %v, want p99 200ms and 1 %% errors", o)
	}
	res = tickOnce(t, sloLimits(adaptive.Objective{}), zoneLoad("a", "zone-a", 2, map[string]float64{"search/web": 300}))
	if o := res.Changed["callee/search"].GetObjective(); o != nil {
		t.Errorf("a callee without an objective published %v", o)
	}
}

// TestCapacityFromProcedureObjective: a procedure's own objective caps
// what its callers share of it, from its own health: create-charge, whose
// p99 blows past 200ms once admitted more than 100 rps, gets a capacity
// near that knee and sheds web's excess on it, while web's calls to
// get-item, healthy and without an objective, lose nothing, and the
// callee as a whole has no estimate.
func TestCapacityFromProcedureObjective(t *testing.T) {
	const knee, offered, items = 100.0, 300.0, 100.0
	set := procLimits(func(svc *limits.Service) {
		svc.Callers = map[string]limits.Bucket{"web": {Limit: 1000}}
		cc := svc.Procedures["create-charge"]
		cc.Capacity, cc.Callers = math.Inf(1), nil
		cc.SLO = adaptive.Objective{LatencyP99: 200 * time.Millisecond}
	})
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	ratio := 0.0
	var res TickResult
	var items0 float64
	for range 8 {
		admitted := offered * (1 - ratio)
		p99 := 20 * time.Millisecond
		if admitted > knee {
			p99 = 800 * time.Millisecond
		}
		z := leafLoad("a", map[string]float64{"checkout/web/create-charge": offered, "checkout/web/get-item": items})
		for _, pr := range z.Services[0].Peers {
			if pr.GetProcedure() == "create-charge" {
				pr.DroppedRps = offered - admitted
			}
		}
		z.Services[0].Health = []*sluicev1.HealthRates{
			hr("create-charge", math.Min(admitted, knee), 0, p99, p99),
			hr("get-item", items, 0, 20*time.Millisecond, 20*time.Millisecond),
		}
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
		res = s.Tick(now, set)
		if p := res.Changed["callee/checkout"]; p != nil {
			ratio = leafOf(p, "web", "create-charge").GetDropRatio()
			items0 = max(items0, leafOf(p, "web", "get-item").GetDropRatio())
		}
		now = now.Add(time.Second)
	}
	e, ok := res.Estimates[ServiceProcedure{"checkout", "create-charge"}]
	if !ok || e.Capacity < 0.8*knee || e.Capacity > 1.2*knee {
		t.Errorf("create-charge's estimate %+v (ok %v), want within 20 %% of its knee %v", e, ok, knee)
	}
	if admitted := offered * (1 - ratio); admitted < 0.8*knee || admitted > 1.2*knee {
		t.Errorf("web's create-charge admitted %.1f rps (ratio %.3f), want about the knee %v", admitted, ratio, knee)
	}
	if items0 != 0 {
		t.Errorf("web's get-item dropped at a ratio of %v at some tick, want 0: it has no objective and is healthy", items0)
	}
	if len(res.Estimates) != 1 {
		t.Errorf("estimates %v, want create-charge's alone", res.Estimates)
	}
}
