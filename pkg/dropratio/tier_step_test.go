package dropratio

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The tiers of the criticality package, which dropratio may not import.
const (
	tierCriticalPlus  uint8 = 1
	tierCritical      uint8 = 2
	tierSheddablePlus uint8 = 3
	tierSheddable     uint8 = 4
)

// tierWant is what one bucket of a scenario must be allowed.
type tierWant struct {
	caller  string
	tier    uint8
	offered float64
	allowed float64 // admitted = min(offered, allowed); +Inf for no bound
	bound   Bound
}

// stepTiers steps one service, capacity C, whose callers are the buckets
// of want, twice (the second a second later, so that ratios are targets),
// and checks each bucket's allowed rate, bound and ratio, and the total
// admitted.
func stepTiers(t *testing.T, capacity float64, limits []CallerLimit, want []tierWant, admitted float64) {
	t.Helper()
	svc := Service{Name: "payments", Capacity: capacity, CallerLimits: limits}
	for _, w := range want {
		svc.Callers = append(svc.Callers, Caller{Name: w.caller, Tier: w.tier, Offered: w.offered, Limit: inf})
	}
	l := mustNew(t, DefaultConfig())
	l.Step(0, []Service{svc})
	out := l.Step(time.Second, []Service{svc})
	checkOutput(t, DefaultConfig(), l, out)
	total := 0.0
	for _, w := range want {
		v := findTier(t, out, w.caller, w.tier)
		total += min(v.Offered, v.Allowed)
		if math.Abs(v.Allowed-w.allowed) > 1e-9*capacity && !(math.IsInf(w.allowed, 1) && math.IsInf(v.Allowed, 1)) || v.Bound != w.bound {
			t.Errorf("%s tier %d: allowed %v (%v), want %v (%v)", w.caller, w.tier, v.Allowed, v.Bound, w.allowed, w.bound)
		}
		ratio := 0.0
		if w.allowed < w.offered {
			ratio = min(1-w.allowed/w.offered, DefaultConfig().PMax)
		}
		if math.Abs(v.Ratio-ratio) > 1e-12 {
			t.Errorf("%s tier %d: ratio %v, want %v", w.caller, w.tier, v.Ratio, ratio)
		}
	}
	if math.Abs(total-admitted) > 1e-9*admitted {
		t.Errorf("admitted %v in all, want %v", total, admitted)
	}
}

func findTier(t *testing.T, out []ServiceVerdict, caller string, tier uint8) Verdict {
	t.Helper()
	for _, sv := range out {
		for _, v := range sv.Verdicts {
			if v.Caller == caller && v.Tier == tier {
				return v
			}
		}
	}
	t.Fatalf("no verdict for %s tier %d in %+v", caller, tier, out)
	return Verdict{}
}

// The overload-tiers scenario: 20,000 rps offered to a callee of
// 10,000. CRITICAL_PLUS and CRITICAL lose nothing; the cut comes from the
// sheddable tiers, lowest first.
func TestTiersOverloadScenario(t *testing.T) {
	t.Run("sheddable-shed", func(t *testing.T) {
		// 4,000 + 3,000 of the two critical tiers, and SHEDDABLE_PLUS's
		// 3,000 fits in what is left exactly: SHEDDABLE gets nothing.
		stepTiers(t, 10000, nil, []tierWant{
			{"web", tierCriticalPlus, 4000, inf, BoundNone},
			{"web", tierSheddable, 2000, 0, BoundCallee},
			{"mobile", tierCritical, 3000, inf, BoundNone},
			{"mobile", tierSheddablePlus, 3000, inf, BoundNone},
			{"batch", tierSheddable, 8000, 0, BoundCallee},
		}, 10000)
	})
	t.Run("sheddable-max-min", func(t *testing.T) {
		// 2,000 left for SHEDDABLE: web and batch share it max-min.
		stepTiers(t, 10000, nil, []tierWant{
			{"web", tierCriticalPlus, 4000, inf, BoundNone},
			{"web", tierSheddable, 2000, 1000, BoundCallee},
			{"mobile", tierCritical, 3000, inf, BoundNone},
			{"mobile", tierSheddablePlus, 1000, inf, BoundNone},
			{"batch", tierSheddable, 8000, 1000, BoundCallee},
		}, 10000)
	})
	t.Run("critical-over-capacity", func(t *testing.T) {
		// CRITICAL_PLUS fits; CRITICAL alone exceeds the 6,000 left and
		// shares it max-min; everything below gets nothing.
		stepTiers(t, 10000, nil, []tierWant{
			{"web", tierCriticalPlus, 4000, inf, BoundNone},
			{"web", tierCritical, 4000, 3000, BoundCallee},
			{"mobile", tierCritical, 8000, 3000, BoundCallee},
			{"mobile", tierSheddablePlus, 1000, 0, BoundCallee},
			{"batch", tierSheddable, 8000, 0, BoundCallee},
		}, 10000)
	})
	t.Run("critical-plus-over-capacity", func(t *testing.T) {
		// Max-min within CRITICAL_PLUS: mobile's 3,000 fits under the
		// level, web gets the other 7,000.
		stepTiers(t, 10000, nil, []tierWant{
			{"web", tierCriticalPlus, 9000, 7000, BoundCallee},
			{"mobile", tierCriticalPlus, 3000, 7000, BoundCallee},
			{"mobile", tierCritical, 8000, 0, BoundCallee},
			{"batch", tierCritical, 8000, 0, BoundCallee},
		}, 10000)
	})
}

// A caller over its own limit sheds its own lower tiers first, whether the
// limit is the caller's across procedures or its leaf's (each tier's entry
// carrying it).
func TestTiersCallerSheds(t *testing.T) {
	t.Run("caller-limit", func(t *testing.T) {
		stepTiers(t, inf, []CallerLimit{{Name: "web", Limit: 5000}}, []tierWant{
			{"web", tierCritical, 4000, inf, BoundNone},
			{"web", tierSheddable, 3000, 1000, BoundCaller},
			{"batch", tierSheddable, 3000, inf, BoundNone},
		}, 8000)
	})
	t.Run("leaf-limit", func(t *testing.T) {
		l := mustNew(t, DefaultConfig())
		in := []Service{{Name: "payments", Capacity: inf, Callers: []Caller{
			{Name: "web", Tier: tierCritical, Offered: 4000, Limit: 5000},
			{Name: "web", Tier: tierSheddable, Offered: 3000, Limit: 5000},
			{Name: "batch", Tier: tierSheddable, Offered: 3000, Limit: inf},
		}}}
		out := l.Step(0, in)
		checkOutput(t, DefaultConfig(), l, out)
		crit, shed := findTier(t, out, "web", tierCritical), findTier(t, out, "web", tierSheddable)
		if crit.Ratio != 0 || crit.Allowed != 5000 || crit.Bound != BoundLeaf {
			t.Errorf("CRITICAL: %+v, want ratio 0, allowed the whole limit", crit)
		}
		if shed.Allowed != 1000 || shed.Bound != BoundLeaf || shed.Reason != OverLimit || math.Abs(shed.Ratio-2.0/3) > 1e-12 {
			t.Errorf("SHEDDABLE: %+v, want 1,000 of 3,000 over its limit", shed)
		}
		if r := l.TierRatio("payments", "web", "", tierSheddable); r != shed.Ratio || l.LeafRatio("payments", "web", "") != 0 {
			t.Errorf("TierRatio %v, LeafRatio %v", r, l.LeafRatio("payments", "web", ""))
		}
	})
}

// A bucket of a tier that finds nothing left of a limit, but offers
// nothing, is not blocked, even beside one of its tier that offers
// something and is cut to 0: only a limit of 0 blocks a bucket without
// traffic.
func TestTiersStarvedWithoutTrafficNotBlocked(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	out := l.Step(time.Second, []Service{{
		Name:         "payments",
		Capacity:     inf,
		CallerLimits: []CallerLimit{{Name: "web", Limit: 5000}, {Name: "blocked", Limit: 0}},
		Callers: []Caller{
			{Name: "web", Tier: tierCritical, Offered: 6000, Limit: inf},
			{Name: "web", Tier: tierSheddable, Offered: 0, Limit: inf},
			{Name: "web", Procedure: "get", Tier: tierSheddable, Offered: 100, Limit: inf},
			{Name: "mobile", Tier: tierCritical, Offered: 6000, Limit: 5000},
			{Name: "mobile", Tier: tierSheddable, Offered: 0, Limit: 5000},
			{Name: "blocked", Tier: tierSheddable, Offered: 0, Limit: inf},
		},
	}})
	checkOutput(t, DefaultConfig(), l, out)
	for _, c := range []string{"web", "mobile"} {
		if v := findTier(t, out, c, tierSheddable); v.Ratio != 0 || v.Allowed == 0 {
			t.Errorf("%s SHEDDABLE without traffic: %+v, want ratio 0", c, v)
		}
		if v := findTier(t, out, c, tierCritical); math.Abs(v.Ratio-1.0/6) > 1e-12 {
			t.Errorf("%s CRITICAL: %+v, want 1,000 of 6,000 dropped", c, v)
		}
	}
	for _, v := range out[0].Verdicts {
		if v.Caller == "web" && v.Procedure == "get" && (v.Allowed != 0 || v.Ratio != DefaultConfig().PMax || v.Bound != BoundCaller) {
			t.Errorf("web/get SHEDDABLE: %+v, want cut to 0 by its caller", v)
		}
	}
	if v := findTier(t, out, "blocked", tierSheddable); v.Ratio != DefaultConfig().PMax || v.Reason != OverLimit {
		t.Errorf("blocked: %+v, want PMax", v)
	}
}

// Verdicts come sorted by caller, procedure and tier; entries of one tier
// merge, entries of different tiers do not; SeedTier seeds one tier.
func TestTiersKeyed(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	l.SeedTier("payments", "web", "pay", tierSheddable, 0.5)
	if l.TierRatio("payments", "web", "pay", tierSheddable) != 0.5 || l.LeafRatio("payments", "web", "pay") != 0 {
		t.Fatalf("seeded tier 4: ratios %v and %v", l.TierRatio("payments", "web", "pay", tierSheddable), l.LeafRatio("payments", "web", "pay"))
	}
	out := l.Step(0, []Service{{Name: "payments", Capacity: 100, Callers: []Caller{
		{Name: "web", Procedure: "pay", Tier: tierSheddable, Offered: 50, Limit: inf},
		{Name: "web", Procedure: "pay", Tier: tierCritical, Offered: 30, Limit: inf},
		{Name: "web", Procedure: "pay", Tier: tierSheddable, Offered: 50, Limit: inf},
		{Name: "web", Procedure: "get", Tier: tierCritical, Offered: 10, Limit: inf},
	}}})
	checkOutput(t, DefaultConfig(), l, out)
	got := out[0].Verdicts
	if len(got) != 3 || got[0].Procedure != "get" || got[1].Tier != tierCritical || got[2].Tier != tierSheddable || got[2].Offered != 100 {
		t.Fatalf("verdicts %+v", got)
	}
	// 60 left for SHEDDABLE's 100; the seeded 0.5 holds (dt 0), above 0.4.
	if got[2].Allowed != 60 || got[2].Ratio != 0.5 {
		t.Errorf("SHEDDABLE: %+v, want allowed 60, the seeded ratio", got[2])
	}
}

// A tiered steady state allocates only the slices Step returns, as an
// untiered one does.
func TestStepTiersAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := mustNew(t, DefaultConfig())
	in := benchTiers(benchMesh()[:50])
	l.Step(0, in)
	l.Step(time.Second, in)
	if got := testing.AllocsPerRun(20, func() { l.Step(time.Second, in) }); got != 2 {
		t.Errorf("Step allocates %v times in a steady state, want 2", got)
	}
}

// benchTiers gives every caller of services a tier, CRITICAL_PLUS to
// SHEDDABLE in turn: the same buckets, rates and limits, tiered.
func benchTiers(services []Service) []Service {
	out := make([]Service, len(services))
	for i, s := range services {
		s.Callers = append([]Caller(nil), s.Callers...)
		for j := range s.Callers {
			s.Callers[j].Tier = uint8(1 + j%4)
		}
		out[i] = s
	}
	return out
}

// BenchmarkStepTiers is BenchmarkStep with every bucket tiered: the same
// mesh through the tree, where the untiered one takes the flat split.
func BenchmarkStepTiers(b *testing.B) {
	in := benchTiers(benchMesh())
	l := mustNew(b, DefaultConfig())
	l.Step(0, in)
	b.ReportAllocs()
	for b.Loop() {
		l.Step(time.Second, in)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(1100*100), "ns/bucket")
}

// BenchmarkHierarchyTiers is BenchmarkHierarchy with each leaf split in
// two tiers of half its rate: twice the leaves.
func BenchmarkHierarchyTiers(b *testing.B) {
	tree := benchTree()
	leaves := tree.Leaves
	tree.Leaves = nil
	for k, lf := range leaves {
		lf.Offered /= 2
		lf.Tier = uint8(1 + k%2)
		tree.Leaves = append(tree.Leaves, lf)
		lf.Tier += 2
		tree.Leaves = append(tree.Leaves, lf)
	}
	rand.New(rand.NewPCG(1, 16)).Shuffle(len(tree.Leaves), func(i, j int) { tree.Leaves[i], tree.Leaves[j] = tree.Leaves[j], tree.Leaves[i] })
	benchFill(b, tree)
}
