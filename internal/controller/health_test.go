package controller

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/health"
)

// hr is a HealthRates of procedure: ok answers a second at latency fast,
// failed ones at slow.
func hr(procedure string, ok, failed float64, fast, slow time.Duration) *sluicev1.HealthRates {
	h := &sluicev1.HealthRates{Procedure: procedure, LatencyRps: make([]float64, health.Buckets), OkRps: ok, FailedRps: failed}
	h.LatencyRps[health.Bucket(fast)] += ok
	h.LatencyRps[health.Bucket(slow)] += failed
	return h
}

func withZoneHealth(z *sluicev1.ZoneLoad, hs ...*sluicev1.HealthRates) *sluicev1.ZoneLoad {
	z.Services[0].Health = hs
	return z
}

// TestHealthAcrossZones: two zones' health adds up per declared procedure,
// undeclared ones fold into _other, "" is the callee as a whole, and the
// p99 and error ratio are read off the sums.
func TestHealthAcrossZones(t *testing.T) {
	res := tickOnce(t, procLimits(nil),
		withZoneHealth(zoneLoad("a", "zone-a", 2, map[string]float64{"checkout/web": 100}),
			hr("create-charge", 980, 20, 5*time.Millisecond, 300*time.Millisecond), hr("/made/Up", 10, 0, time.Millisecond, time.Millisecond)),
		withZoneHealth(zoneLoad("b", "zone-b", 2, map[string]float64{"checkout/web": 100}),
			hr("create-charge", 990, 10, 5*time.Millisecond, 300*time.Millisecond), hr("_other", 5, 5, time.Millisecond, time.Millisecond)))
	cc := res.Health[ServiceProcedure{"checkout", "create-charge"}]
	if cc.OK != 1970 || cc.Failed != 30 || !cc.HasP99 || math.Abs(cc.Errors()-0.015) > 1e-12 {
		t.Errorf("create-charge: %+v (errors %v), want 1970 ok, 30 failed", cc, cc.Errors())
	}
	// 1.5 % of the answers at 300ms: the p99 is among them.
	if cc.P99 < 200*time.Millisecond || cc.P99 > 400*time.Millisecond {
		t.Errorf("create-charge's p99 %v, want about 300ms", cc.P99)
	}
	if o := res.Health[ServiceProcedure{"checkout", "_other"}]; o.OK != 15 || o.Failed != 5 {
		t.Errorf("_other: %+v, want /made/Up folded in: 15 ok, 5 failed", o)
	}
	if all := res.Health[ServiceProcedure{"checkout", ""}]; all.OK != 1985 || all.Failed != 35 {
		t.Errorf("the callee: %+v, want 1985 ok, 35 failed", all)
	}
	if len(res.Health) != 3 {
		t.Errorf("health of %d pairs, want 3: %v", len(res.Health), res.Health)
	}
}

// TestHealthValidation: a bad health entry is left out and counted, the
// rest of the service entry applied.
func TestHealthValidation(t *testing.T) {
	short := hr("create-charge", 1, 0, time.Millisecond, time.Millisecond)
	short.LatencyRps = short.LatencyRps[:3]
	nan := hr("get-item", 1, 0, time.Millisecond, time.Millisecond)
	nan.OkRps = math.NaN()
	lies := hr("/shop.Checkout/Pay", 100, 0, time.Millisecond, time.Millisecond)
	lies.LatencyRps[health.Bucket(time.Millisecond)] = 0
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	z := withZoneHealth(zoneLoad("a", "zone-a", 2, map[string]float64{"checkout/web": 100}),
		short, nan, lies, hr("bad name", 1, 0, time.Millisecond, time.Millisecond),
		hr("_other", 1, 0, time.Millisecond, time.Millisecond), hr("_other", 2, 0, time.Millisecond, time.Millisecond),
		hr("", 7, 0, time.Millisecond, time.Millisecond))
	if err := s.Apply(z, now); err != nil {
		t.Fatal(err)
	}
	d := s.TakeDropped()
	want := map[string]int{ReasonHealthBuckets: 1, ReasonHealthRate: 1, ReasonHealthMismatch: 1, ReasonHealthProcedure: 1, ReasonHealthDuplicate: 2}
	for r, n := range want {
		if d.BadHealth[r] != n {
			t.Errorf("%s: %d left out, want %d (all: %v)", r, d.BadHealth[r], n, d.BadHealth)
		}
	}
	res := s.Tick(now, procLimits(nil))
	if all := res.Health[ServiceProcedure{"checkout", ""}]; all.OK != 7 {
		t.Errorf("the callee: %+v, want the one good entry's 7 ok", all)
	}
	if len(res.Services) != 1 || res.Services["checkout"].Offered != 100 {
		t.Errorf("the service entry's load: %v, want it applied", res.Services)
	}
}
