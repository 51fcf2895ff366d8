package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/criticality"
)

// TestOverloadTiers checks issue #16's goals on the overload-tiers
// scenario, over each phase's judged seconds: no CRITICAL_PLUS or CRITICAL
// request lost while they fit, the callee's admitted rate within ±2% of its
// capacity, and in phase 2 CRITICAL_PLUS whole and CRITICAL sharing the rest
// max-min fairly (batch's 1,000 fits under the level, mobile gets 5,000).
func TestOverloadTiers(t *testing.T) {
	sc := loadBuiltin(t, "overload-tiers")
	r := run(t, sc, sc.Seed)
	m := MeasureTiers(r)
	if m == nil || len(m.Phases) != 2 || len(m.Callees) != 1 {
		t.Fatalf("measures %+v; want 2 phases of one callee", m)
	}
	flow := func(caller string, tier criticality.Tier) *TierFlow {
		for i := range m.Flows {
			if m.Flows[i].Caller == caller && m.Flows[i].Tier == tier {
				return &m.Flows[i]
			}
		}
		t.Fatalf("no flow %s %v", caller, tier)
		return nil
	}
	for p := range m.Phases {
		c := m.Callees[0]
		if dev := c.Admitted[p]/c.Capacity[p] - 1; math.Abs(dev) > 0.02 {
			t.Errorf("phase %d: admitted %.0f rps, %+.2f%% off the capacity %.0f; want within ±2%%", p+1, c.Admitted[p], 100*dev, c.Capacity)
		}
		if f := flow("web", criticality.CriticalPlus); f.Loss[p] > 0.0005 {
			t.Errorf("phase %d: web CRITICAL_PLUS lost %.2f%%; want 0.0%%", p+1, 100*f.Loss[p])
		}
		if f := flow("batch", criticality.Critical); f.Loss[p] > 0.0005 {
			t.Errorf("phase %d: batch CRITICAL lost %.2f%%; want 0.0%%", p+1, 100*f.Loss[p])
		}
		for _, f := range m.Flows {
			if f.Tier >= criticality.SheddablePlus && f.Allowed[p] == 0 && f.Admitted[p] > f.Offered[p]*(1-sc.Loop.Controller.Law.PMax)*1.1+1 {
				t.Errorf("phase %d: %s %v admitted %.0f of %.0f; the law allows it nothing but 1 − p_max", p+1, f.Caller, f.Tier, f.Admitted[p], f.Offered[p])
			}
		}
	}
	if f := flow("mobile", criticality.Critical); f.Loss[0] > 0.0005 {
		t.Errorf("phase 1: mobile CRITICAL lost %.2f%%; want 0.0%%", 100*f.Loss[0])
	}
	// Phase 2: critical alone exceeds the capacity.
	mob := flow("mobile", criticality.Critical)
	if math.Abs(mob.Allowed[1]-5000) > 1 {
		t.Errorf("phase 2: the oracle allows mobile CRITICAL %.0f; want 5,000", mob.Allowed[1])
	}
	if d := mob.Admitted[1]/mob.Allowed[1] - 1; math.Abs(d) > 0.03 {
		t.Errorf("phase 2: mobile CRITICAL admitted %.0f, %+.2f%% off its max-min share %.0f; want within ±3%%", mob.Admitted[1], 100*d, mob.Allowed[1])
	}
	sp := flow("mobile", criticality.SheddablePlus)
	if d := sp.Admitted[0]/sp.Allowed[0] - 1; math.Abs(d) > 0.05 {
		t.Errorf("phase 1: mobile SHEDDABLE_PLUS admitted %.0f, %+.2f%% off what is left, %.0f; want within ±5%%", sp.Admitted[0], 100*d, sp.Allowed[0])
	}
}

func TestFlowCriticalityInvalid(t *testing.T) {
	const doc = `
duration: 1s
zones: [a]
services: {api: {sidecars: {a: 1}}}
limits: {services: {api: {capacity: 10, criticality: {default: CRITICAL, max: CRITICAL}}}}
flows:
  - {callee: api, caller: web, criticality: URGENT, rate: {constant: 1}}
`
	_, err := Parse(strings.NewReader(doc), "x")
	if err == nil || !strings.Contains(err.Error(), "flows[0].criticality") || !strings.Contains(err.Error(), "web→api") {
		t.Fatalf("err = %v; want one naming flows[0].criticality and web→api", err)
	}
}
