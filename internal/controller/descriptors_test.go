package controller

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// apiLimits is service api with descriptor tenant: 50 rps per value, acme
// 500, blocked 0, requests without a tenant 10.
func apiLimits() *limits.Set {
	return limits.NewSet(map[string]*limits.Service{
		"api": {
			Name: "api", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Descriptors: []limits.Descriptor{{
				Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"},
				Limit: 50, Missing: 10, Quantile: 0.95, Overrides: map[string]float64{"blocked": 0, "acme": 500},
			}},
		},
	})
}

// tenantLoad is one aggregator's zone load of api with tenant values
// (value → offered rps).
func tenantLoad(agg string, values map[string]float64) *sluicev1.ZoneLoad {
	z := zoneLoad(agg, "zone-"+agg, 2, map[string]float64{"api/web": 1})
	dr := &sluicev1.DescriptorRates{Descriptor_: "tenant"}
	for _, v := range slices.Sorted(func(yield func(string) bool) {
		for v := range values {
			if !yield(v) {
				return
			}
		}
	}) {
		dr.Values = append(dr.Values, &sluicev1.ValueRate{Value: v, OfferedRps: values[v]})
		dr.OfferedRps += values[v]
	}
	z.Services[0].Descriptors = []*sluicev1.DescriptorRates{dr}
	return z
}

func values(dp *sluicev1.DescriptorPolicy) map[string]*sluicev1.ValuePolicy {
	m := map[string]*sluicev1.ValuePolicy{}
	for _, v := range dp.GetValues() {
		m[v.GetValue()] = v
	}
	return m
}

func tenantPolicy(t *testing.T, res TickResult) *sluicev1.DescriptorPolicy {
	t.Helper()
	p := res.Changed["callee/api"]
	if p == nil || len(p.GetDescriptors()) != 1 {
		t.Fatalf("callee/api = %v", p)
	}
	return p.GetDescriptors()[0]
}

// Values are summed across zones; each gets the single-bucket ratio of its
// own limit: an override, the missing limit, or the descriptor's; a
// compliant value is listed at 0.
func TestDescriptorRatiosAcrossZones(t *testing.T) {
	s := warmState(t)
	now := t0.Add(3 * time.Second)
	for _, z := range []*sluicev1.ZoneLoad{
		tenantLoad("a", map[string]float64{"evil": 150, "acme": 400, "_missing": 20, "small": 10, "blocked": 3}),
		tenantLoad("b", map[string]float64{"evil": 50, "acme": 600, "small": 20}),
	} {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	res := s.Tick(now, apiLimits())
	dp := tenantPolicy(t, res)
	if dp.GetName() != "tenant" || dp.GetSource() != "header x-tenant-id" || dp.GetLimitRps() != 50 || dp.GetMissingLimitRps() != 10 || dp.GetQuantile() != 0.95 {
		t.Errorf("config = %v", dp)
	}
	if got := dp.GetOverrides(); len(got) != 2 || got[0].GetValue() != "acme" || got[0].GetLimitRps() != 500 || got[1].GetValue() != "blocked" || got[1].GetLimitRps() != 0 {
		t.Errorf("overrides = %v, want acme 500, blocked 0, sorted", got)
	}
	pmax := testConfig().Law.PMax
	for v, want := range map[string]struct{ ratio, offered, limit float64 }{
		"evil":     {1 - 50.0/200, 200, 50},
		"acme":     {1 - 500.0/1000, 1000, 500},
		"_missing": {1 - 10.0/20, 20, 10},
		"small":    {0, 30, 50},
		"blocked":  {pmax, 3, 0},
	} {
		got := values(dp)[v]
		if got == nil || math.Abs(got.GetDropRatio()-want.ratio) > 1e-12 || got.GetOfferedRps() != want.offered || got.GetLimitRps() != want.limit {
			t.Errorf("%s = %v, want %+v", v, got, want)
		}
	}
	if !slices.IsSortedFunc(dp.GetValues(), func(a, b *sluicev1.ValuePolicy) int { return strings.Compare(a.GetValue(), b.GetValue()) }) {
		t.Errorf("values not sorted: %v", dp.GetValues())
	}
	if want := []DescriptorStat{{Service: "api", Descriptor: "tenant", Listed: 5, Abusive: 4, Offered: 1253}}; !slices.Equal(res.Descriptors, want) {
		t.Errorf("stats %+v, want %+v", res.Descriptors, want)
	}
}

// A zone's values are replaced by its next flush and leave the sums with
// the zone; a dropped value then releases as a caller's ratio does, and is
// listed until it reaches 0.
func TestDescriptorValuesReplacedAndExpire(t *testing.T) {
	s := warmState(t)
	now := t0.Add(3 * time.Second)
	lim := apiLimits()
	s.Apply(tenantLoad("a", map[string]float64{"evil": 100}), now)
	s.Apply(tenantLoad("b", map[string]float64{"evil": 100}), now)
	if r := values(tenantPolicy(t, s.Tick(now, lim)))["evil"].GetDropRatio(); math.Abs(r-0.75) > 1e-12 {
		t.Fatalf("evil at 200 rps: ratio %v, want 0.75", r)
	}
	// b's next flush replaces its last: 100 + 300, not 100 + 100 + 300.
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"evil": 100}), now)
	s.Apply(tenantLoad("b", map[string]float64{"evil": 300}), now)
	if v := values(tenantPolicy(t, s.Tick(now, lim)))["evil"]; v.GetOfferedRps() != 400 || math.Abs(v.GetDropRatio()-(1-50.0/400)) > 1e-12 {
		t.Fatalf("evil after b's next flush = %v, want 400 rps", v)
	}
	// a goes silent; b's values change to a compliant one. a's load
	// leaves the sums after StaleAfter intervals.
	var dp *sluicev1.DescriptorPolicy
	for i := range 10 {
		now = now.Add(time.Second)
		s.Apply(tenantLoad("b", map[string]float64{"good": 5}), now)
		res := s.Tick(now, lim)
		if p := res.Changed["callee/api"]; p != nil {
			dp = p.GetDescriptors()[0]
		}
		if i == 0 {
			if v := values(dp)["evil"]; v == nil || v.GetOfferedRps() != 100 {
				t.Errorf("evil while a is still live = %v, want a's 100 rps", v)
			}
		}
	}
	if s.Aggregators() != 1 {
		t.Fatalf("%d aggregators, want a gone", s.Aggregators())
	}
	if _, ok := values(dp)["evil"]; ok || values(dp)["good"] == nil {
		t.Errorf("after release: %v, want good only", dp.GetValues())
	}
}

// A value on its way to 0 is still listed, with its falling ratio, so
// sidecars hear of the release.
func TestDescriptorRatioReleases(t *testing.T) {
	s := warmState(t)
	now := t0.Add(3 * time.Second)
	lim := apiLimits()
	s.Apply(tenantLoad("a", map[string]float64{"evil": 500}), now)
	s.Tick(now, lim)
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"other": 1}), now)
	v := values(tenantPolicy(t, s.Tick(now, lim)))["evil"]
	if v == nil || !(v.GetDropRatio() > 0 && v.GetDropRatio() < 0.9) || v.GetOfferedRps() != 0 {
		t.Errorf("evil a second after it stopped = %v, want listed, releasing from 0.9", v)
	}
}

// The list's bound: reserved values first, then dropped ones by offered
// rate, then compliant ones; the rest cut and counted.
func TestDescriptorListBound(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDescriptorValues = 5
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	s.Warm(t0.Add(2 * time.Second))
	now := t0.Add(3 * time.Second)
	// Two zones, each within the bound, seven values between them.
	for _, z := range []*sluicev1.ZoneLoad{
		tenantLoad("a", map[string]float64{"_invalid": 2, "d1": 100, "d2": 60, "c1": 49, "c2": 40}),
		tenantLoad("b", map[string]float64{"d3": 55, "c3": 30}),
	} {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	res := s.Tick(now, apiLimits())
	var got []string
	for _, v := range tenantPolicy(t, res).GetValues() {
		got = append(got, v.GetValue())
	}
	// _invalid is reserved: listed whatever its rate; d1-d3 are over 50.
	if want := []string{"_invalid", "c1", "d1", "d2", "d3"}; !slices.Equal(got, want) {
		t.Errorf("listed %q, want %q", got, want)
	}
	if st := res.Descriptors[0]; st.Listed != 5 || st.Cut != 2 || st.Abusive != 3 {
		t.Errorf("stats %+v, want 5 listed, 2 cut, 3 abusive", st)
	}
	vs := []dropratio.Verdict{{Caller: "a", Offered: 90}, {Caller: "b", Ratio: 0.1, Offered: 10}, {Caller: "c", Ratio: 0.2, Offered: 20},
		{Caller: "_missing", Offered: 1}, {Caller: "e", Ratio: 0.2, Offered: 20}}
	var ranked []string
	kept, cut := rankValues(vs, nil, 3)
	for _, v := range kept {
		ranked = append(ranked, v.Caller)
	}
	if want := []string{"_missing", "c", "e"}; !slices.Equal(ranked, want) || cut != 2 {
		t.Errorf("ranked to 3: %q, cut %d; want %q, cut 2", ranked, cut, want)
	}
}

// A zone load over the bound keeps its reserved values, then its largest.
func TestDescriptorZoneBound(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDescriptorValues = 2
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(tenantLoad("a", map[string]float64{"_missing": 1, "x": 9, "y": 8, "z": 7}), t0); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range s.aggs["a"].load.GetServices()[0].GetDescriptors()[0].GetValues() {
		got = append(got, v.GetValue())
	}
	if want := []string{"_missing", "x"}; !slices.Equal(got, want) {
		t.Errorf("kept %q, want %q", got, want)
	}
	if d := s.TakeDropped(); d.BadDescriptors[ReasonValueTooMany] != 2 {
		t.Errorf("dropped %v", d.BadDescriptors)
	}
}

// A policy of a service with descriptors is pushed again when a value's
// ratio moves, even if its peers did not, and not when nothing moved.
func TestDescriptorChangesRepublish(t *testing.T) {
	s := warmState(t)
	now := t0.Add(3 * time.Second)
	lim := apiLimits()
	s.Apply(tenantLoad("a", map[string]float64{"evil": 100}), now)
	if res := s.Tick(now, lim); res.Changed["callee/api"] == nil {
		t.Fatal("first policy not published")
	}
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"evil": 100}), now)
	if res := s.Tick(now, lim); res.Changed["callee/api"] != nil {
		t.Error("republished with nothing changed")
	}
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"evil": 200}), now)
	if res := s.Tick(now, lim); res.Changed["callee/api"] == nil {
		t.Error("not republished when evil's ratio rose from 0.5 to 0.75")
	}
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"evil": 200, "new": 1}), now)
	if res := s.Tick(now, lim); res.Changed["callee/api"] == nil {
		t.Error("not republished when a value joined the list")
	}
	// A limits change alone (the quantile) goes out too.
	lim2 := apiLimits()
	lim2.Service("api").Descriptors[0].Quantile = 0.99
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"evil": 200, "new": 1}), now)
	if res := s.Tick(now, lim2); res.Changed["callee/api"] == nil || tenantPolicy(t, res).GetQuantile() != 0.99 {
		t.Error("not republished when the quantile changed")
	}
}

// A service with descriptors and no traffic yet has its policy with its
// limits, and no values; a descriptor the limits do not give is ignored.
func TestDescriptorWithoutTraffic(t *testing.T) {
	s := warmState(t)
	now := t0.Add(3 * time.Second)
	z := zoneLoad("a", "zone-a", 1, map[string]float64{"api/web": 1})
	z.Services[0].Descriptors = []*sluicev1.DescriptorRates{{Descriptor_: "plan", OfferedRps: 9, Values: []*sluicev1.ValueRate{{Value: "x", OfferedRps: 9}}}}
	s.Apply(z, now)
	res := s.Tick(now, apiLimits())
	dp := tenantPolicy(t, res)
	if dp.GetName() != "tenant" || len(dp.GetValues()) != 0 || dp.GetLimitRps() != 50 {
		t.Errorf("tenant = %v", dp)
	}
}

// Hostile entries are dropped one by one, with a counted reason; the rest
// of the service entry counts.
func TestDescriptorValidation(t *testing.T) {
	cfg := testConfig()
	cfg.MaxDescriptorValues = 3
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	z := zoneLoad("a", "zone-a", 1, map[string]float64{"api/web": 1, "web/api": 1})
	z.Services[1].Direction = sluicev1.Direction_DIRECTION_OUTBOUND
	z.Services[1].Descriptors = []*sluicev1.DescriptorRates{{Descriptor_: "tenant"}}
	vr := func(v string, r float64) *sluicev1.ValueRate { return &sluicev1.ValueRate{Value: v, OfferedRps: r} }
	z.Services[0].Descriptors = []*sluicev1.DescriptorRates{
		{Descriptor_: "Bad"},
		{Descriptor_: "dup"}, {Descriptor_: "dup"},
		{Descriptor_: "rate", OfferedRps: 1, DroppedRps: 2},
		{Descriptor_: "nan", OfferedRps: math.NaN()},
		{Descriptor_: "tenant", OfferedRps: 100, Values: []*sluicev1.ValueRate{
			vr("", 1), vr(strings.Repeat("x", descriptor.MaxValueLen+1), 1), vr("\xff", 1), vr("neg", -1), vr("inf", math.Inf(1)),
			vr("twice", 1), vr("twice", 2), vr("_missing", 1), vr("_invalid", 1),
			vr("a", 5), vr("b", 4), vr("c", 3),
		}},
		{Descriptor_: "d1"}, {Descriptor_: "d2"}, {Descriptor_: "d3"}, {Descriptor_: "d4"},
	}
	if err := s.Apply(z, t0); err != nil {
		t.Fatal(err)
	}
	d := s.TakeDropped()
	want := map[string]int{
		ReasonDescriptorOutbound: 1, ReasonDescriptorName: 1, ReasonDescriptorDuplicate: 2, ReasonDescriptorRate: 2,
		ReasonValue: 3, ReasonValueRate: 2, ReasonValueDuplicate: 2, ReasonValueTooMany: 2, ReasonDescriptorTooMany: 1,
	}
	if fmt.Sprint(d.BadDescriptors) != fmt.Sprint(want) {
		t.Errorf("dropped %v, want %v", d.BadDescriptors, want)
	}
	if !strings.HasPrefix(d.FirstDescriptor, "aggregator a: ") {
		t.Errorf("first %q", d.FirstDescriptor)
	}
	kept := s.aggs["a"].load.GetServices()
	var names []string
	for _, dr := range kept[0].GetDescriptors() {
		names = append(names, dr.GetDescriptor_())
	}
	if want := []string{"tenant", "d1", "d2", "d3"}; !slices.Equal(names, want) {
		t.Errorf("descriptors kept %q, want %q", names, want)
	}
	var vals []string
	for _, v := range kept[0].GetDescriptors()[0].GetValues() {
		vals = append(vals, v.GetValue())
	}
	// Of 5 good values, the reserved ones, then the largest.
	if want := []string{"_invalid", "_missing", "a"}; !slices.Equal(vals, want) {
		t.Errorf("values kept %q, want %q", vals, want)
	}
	if kept[1].GetDescriptors() != nil {
		t.Errorf("outbound descriptors kept: %v", kept[1].GetDescriptors())
	}
}

func TestDescriptorMetrics(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	m.observeDescriptors([]DescriptorStat{{Service: "api", Descriptor: "tenant", Listed: 5, Cut: 2, Abusive: 3, ZoneCut: 7}})
	if v := testutil.ToFloat64(m.descCut.WithLabelValues("api", "tenant")); v != 2 {
		t.Errorf("cut = %v", v)
	}
	if v := testutil.ToFloat64(m.descZoneCut.WithLabelValues("api", "tenant")); v != 7 {
		t.Errorf("zone cut = %v", v)
	}
	m.observeDescriptors(nil)
	if n := testutil.CollectAndCount(m.descListed); n != 0 {
		t.Errorf("%d series left of a descriptor the limits no longer give", n)
	}
}

// BenchmarkTickDescriptors: one tick of a service with the most
// descriptors, each with a full list of values from each of 10 zones, a
// tenth of them over their limit; half of each zone's values are its own.
func BenchmarkTickDescriptors(b *testing.B) {
	const zones = 10
	set := apiLimits()
	api := set.Service("api")
	for i := 1; i < descriptor.MaxPerService; i++ {
		d := api.Descriptors[0]
		d.Name = fmt.Sprintf("tenant%d", i)
		api.Descriptors = append(api.Descriptors, d)
	}
	s, err := NewState(testConfig(), t0)
	if err != nil {
		b.Fatal(err)
	}
	now := t0.Add(3 * time.Second)
	apply := func() {
		for z := range zones {
			load := zoneLoad(fmt.Sprintf("agg-%d", z), fmt.Sprintf("zone-%d", z), 10, map[string]float64{"api/web": 1})
			for _, d := range api.Descriptors {
				dr := &sluicev1.DescriptorRates{Descriptor_: d.Name}
				for v := range DefaultMaxDescriptorValues {
					owner, rate := "shared", 4.0
					if v%2 == 1 {
						owner = fmt.Sprintf("z%d", z)
					}
					if v%10 == 0 {
						rate = 40
					}
					dr.Values = append(dr.Values, &sluicev1.ValueRate{Value: fmt.Sprintf("%s-%d", owner, v), OfferedRps: rate})
				}
				load.Services[0].Descriptors = append(load.Services[0].Descriptors, dr)
			}
			if err := s.Apply(load, now); err != nil {
				b.Fatal(err)
			}
		}
	}
	apply()
	s.Tick(now, set)
	b.ResetTimer()
	for range b.N {
		now = now.Add(time.Second)
		b.StopTimer()
		apply()
		b.StartTimer()
		s.Tick(now, set)
	}
	b.StopTimer()
	res := s.Tick(now.Add(time.Second), set)
	b.ReportMetric(float64(res.Descriptors[0].Abusive), "abusive/descriptor")
	b.ReportMetric(float64(res.Descriptors[0].Cut), "cut/descriptor")
}

// holdState is a warm state holding compliant values for hold, with a
// TTL long enough that no refresh falls in a test, and at most max values
// listed per descriptor (0: the default).
func holdState(t *testing.T, hold time.Duration, max int) *State {
	t.Helper()
	cfg := testConfig()
	cfg.DescriptorHold = hold
	cfg.PolicyTTL = time.Hour
	cfg.MaxDescriptorValues = max
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	s.Warm(t0.Add(2 * time.Second))
	return s
}

// tickTenants applies one zone load of tenant values at now and ticks;
// it returns the tick and the tenant policy in force after it.
func tickTenants(t *testing.T, s *State, now time.Time, lim *limits.Set, vals map[string]float64) (TickResult, *sluicev1.DescriptorPolicy) {
	t.Helper()
	if err := s.Apply(tenantLoad("a", vals), now); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(now, lim)
	p := s.published["callee/api"]
	if p == nil || len(p.policy.GetDescriptors()) != 1 {
		t.Fatalf("callee/api = %v", p)
	}
	return res, p.policy.GetDescriptors()[0]
}

func listedValues(dp *sluicev1.DescriptorPolicy) []string {
	var out []string
	for _, v := range dp.GetValues() {
		out = append(out, v.GetValue())
	}
	return out
}

// A compliant value reported in some ticks and not in others stays
// listed, ratio 0 at its last offered rate, through gaps shorter than the
// hold, and is not pushed again while held; it leaves the list, and the
// policy is pushed, the first tick the hold after its last report.
func TestDescriptorHoldThroughGaps(t *testing.T) {
	s := holdState(t, 5*time.Second, 0)
	lim := apiLimits()
	now := t0.Add(3 * time.Second)
	res, dp := tickTenants(t, s, now, lim, map[string]float64{"flap": 3, "steady": 4})
	if res.Changed["callee/api"] == nil || !slices.Equal(listedValues(dp), []string{"flap", "steady"}) {
		t.Fatalf("first tick listed %q", listedValues(dp))
	}
	// Three gaps of 1 to 4 ticks: flap stays listed as last reported.
	for _, gap := range []int{1, 4, 2} {
		for i := range gap {
			now = now.Add(time.Second)
			res, dp := tickTenants(t, s, now, lim, map[string]float64{"steady": 4})
			v := values(dp)["flap"]
			if v == nil || v.GetDropRatio() != 0 || v.GetOfferedRps() != 3 || v.GetLimitRps() != 50 {
				t.Fatalf("gap of %d, tick %d: flap = %v, want held at 0, 3 rps", gap, i+1, v)
			}
			if res.Changed["callee/api"] != nil {
				t.Errorf("gap of %d, tick %d: pushed again while nothing changed", gap, i+1)
			}
			if st := res.Descriptors[0]; st.Held != 1 || st.Listed != 2 {
				t.Errorf("gap of %d, tick %d: stats %+v, want 1 held of 2 listed", gap, i+1, st)
			}
		}
		now = now.Add(time.Second)
		res, dp := tickTenants(t, s, now, lim, map[string]float64{"flap": 2, "steady": 4})
		// Its rate moved, not its ratio: nothing to push.
		if v := values(dp)["flap"]; v == nil || res.Descriptors[0].Held != 0 || res.Changed["callee/api"] != nil {
			t.Fatalf("flap reported again = %v, stats %+v, pushed %v; want listed, reported, not pushed", v, res.Descriptors[0], res.Changed["callee/api"] != nil)
		}
	}
	// Held for 4 ticks after its last report, gone at 5.
	for i := 1; i <= 5; i++ {
		now = now.Add(time.Second)
		res, dp := tickTenants(t, s, now, lim, map[string]float64{"steady": 4})
		v := values(dp)["flap"]
		switch {
		case i < 5 && (v == nil || res.Changed["callee/api"] != nil):
			t.Errorf("%ds after its last report: flap = %v, pushed %v; want held, not pushed", i, v, res.Changed["callee/api"] != nil)
		case i == 5 && (v != nil || res.Changed["callee/api"] == nil):
			t.Errorf("at the hold: flap = %v, pushed %v; want gone and pushed", v, res.Changed["callee/api"] != nil)
		}
	}
	if n := len(s.held[descriptorKey{"api", "tenant"}]); n != 1 {
		t.Errorf("%d values held, want steady only", n)
	}
}

// The same loads with a hold and without it list the same values when no
// compliant value goes unreported: hold 0 lists a value only while it is
// reported, and a dropped value, held or not, releases as the law has it.
func TestDescriptorHoldZeroAndAbusers(t *testing.T) {
	lim := apiLimits()
	off, on := holdState(t, 0, 0), holdState(t, 30*time.Second, 0)
	// evil is dropped, stops, is released to 0 by the law, comes back.
	loads := []map[string]float64{{"evil": 200, "good": 5}, {"evil": 200, "good": 5}}
	for range 20 {
		loads = append(loads, map[string]float64{"good": 5})
	}
	loads = append(loads, map[string]float64{"evil": 300, "good": 5}, map[string]float64{"good": 5})
	now := t0.Add(3 * time.Second)
	for i, vals := range loads {
		_, a := tickTenants(t, off, now, lim, vals)
		_, b := tickTenants(t, on, now, lim, vals)
		if !slices.EqualFunc(a.GetValues(), b.GetValues(), func(x, y *sluicev1.ValuePolicy) bool {
			return x.GetValue() == y.GetValue() && x.GetDropRatio() == y.GetDropRatio()
		}) {
			t.Errorf("tick %d: without hold %v, with it %v", i, a.GetValues(), b.GetValues())
		}
		now = now.Add(time.Second)
	}
	if off.held != nil {
		t.Errorf("hold 0 keeps %v", off.held)
	}
	// Without a hold an unreported compliant value leaves at once.
	_, a := tickTenants(t, off, now, lim, map[string]float64{"evil": 300})
	_, b := tickTenants(t, on, now, lim, map[string]float64{"evil": 300})
	if values(a)["good"] != nil || values(b)["good"] == nil {
		t.Errorf("good unreported: without hold %v, with it %v; want it listed with the hold only", listedValues(a), listedValues(b))
	}
}

// Held values rank after the reported ones and are displaced first when
// the list is full; what is held is what was listed, so never more than
// the bound; a reported value is simply reported; a held value's limit
// changing, or its descriptor leaving the limits, ends its hold.
func TestDescriptorHoldBound(t *testing.T) {
	s := holdState(t, 30*time.Second, 3)
	lim := apiLimits()
	k := descriptorKey{"api", "tenant"}
	now := t0.Add(3 * time.Second)
	tickTenants(t, s, now, lim, map[string]float64{"a": 40, "b": 30, "c": 20})
	now = now.Add(time.Second)
	res, dp := tickTenants(t, s, now, lim, map[string]float64{"d": 10, "e": 5})
	if got := listedValues(dp); !slices.Equal(got, []string{"a", "d", "e"}) {
		t.Errorf("listed %q, want a (held, largest), d, e", got)
	}
	if st := res.Descriptors[0]; st.Held != 1 || st.Cut != 2 || st.Listed != 3 {
		t.Errorf("stats %+v, want 1 held, 2 cut", st)
	}
	if n := len(s.held[k]); n != 3 {
		t.Errorf("%d values held, want the 3 listed", n)
	}
	// A dropped value and two compliant ones displace every held one.
	now = now.Add(time.Second)
	_, dp = tickTenants(t, s, now, lim, map[string]float64{"x": 500, "y": 1, "z": 1})
	if got := listedValues(dp); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Errorf("listed %q, want x, y, z", got)
	}
	if n := len(s.held[k]); n != 2 {
		t.Errorf("%d values held, want y and z (x is dropped: the law's)", n)
	}
	// Reported again: listed at its new rate, not as held.
	now = now.Add(time.Second)
	res, dp = tickTenants(t, s, now, lim, map[string]float64{"y": 7})
	if v := values(dp)["y"]; v == nil || v.GetOfferedRps() != 7 || res.Descriptors[0].Held != 1 {
		t.Errorf("y = %v, stats %+v; want reported at 7, z held", v, res.Descriptors[0])
	}
	// z's limit changes: its hold ends.
	lim2 := apiLimits()
	lim2.Service("api").Descriptors[0].Overrides["z"] = 2
	now = now.Add(time.Second)
	if _, dp = tickTenants(t, s, now, lim2, map[string]float64{"y": 7}); values(dp)["z"] != nil {
		t.Errorf("z held past its limit's change: %v", listedValues(dp))
	}
	// The descriptor leaves the limits: nothing is held.
	noDesc := apiLimits()
	noDesc.Service("api").Descriptors = nil
	now = now.Add(time.Second)
	s.Apply(tenantLoad("a", map[string]float64{"y": 7}), now)
	s.Tick(now, noDesc)
	if len(s.held) != 0 {
		t.Errorf("held %v after the descriptor left the limits", s.held)
	}
}

// A per-value limit under the law's MinRate (1 rps) holds: a client
// address limited to 0.1 rps that sends 0.8 is dropped 7/8, where a
// caller at that rate would be spared as noise.
func TestDescriptorLimitUnderMinRate(t *testing.T) {
	s := warmState(t)
	now := t0.Add(3 * time.Second)
	set := limits.NewSet(map[string]*limits.Service{
		"api": {
			Name: "api", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Descriptors: []limits.Descriptor{{
				Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"},
				Limit: 0.1, Missing: 0.1, Quantile: 0.95,
			}},
		},
	})
	if err := s.Apply(tenantLoad("a", map[string]float64{"login-storm": 0.8}), now); err != nil {
		t.Fatal(err)
	}
	got := values(tenantPolicy(t, s.Tick(now, set)))["login-storm"]
	if want := 1 - 0.1/0.8; got == nil || math.Abs(got.GetDropRatio()-want) > 1e-12 {
		t.Errorf("login-storm = %v, want ratio %v", got, want)
	}
}
