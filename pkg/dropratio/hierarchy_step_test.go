package dropratio

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// findLeaf returns the verdict of one leaf; ok is false if it is not in out.
func findLeaf(out []ServiceVerdict, service, caller, procedure string) (Verdict, bool) {
	for _, sv := range out {
		if sv.Service == service {
			for _, v := range sv.Verdicts {
				if v.Caller == caller && v.Procedure == procedure {
					return v, true
				}
			}
		}
	}
	return Verdict{}, false
}

// TestFillNested's tree through Step: per-leaf ratios from the allowed
// rates, then the per-bucket law (slow release, carry-over) per leaf.
func TestStepProcedures(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	leaves := []Caller{
		{Name: "web", Procedure: "pay", Offered: 150, Limit: 80},
		{Name: "mobile", Procedure: "pay", Offered: 60, Limit: inf, Mode: Shadow},
		{Name: "web", Procedure: "list", Offered: 100, Limit: inf},
		{Name: "mobile", Procedure: "list", Offered: 50, Limit: inf},
		{Name: "bot", Procedure: "pay", Offered: 0, Limit: inf},
	}
	svc := Service{
		Name: "checkout", Capacity: 200, Callers: leaves,
		Procedures:   []Procedure{{Name: "pay", Capacity: 100}},
		CallerLimits: []CallerLimit{{Name: "web", Limit: 120}, {Name: "bot", Limit: 0}},
	}
	out := l.Step(0, []Service{svc})
	checkOutput(t, DefaultConfig(), l, out)
	want := []struct {
		caller, procedure string
		target, allowed   float64
		reason            Reason
		bound             Bound
	}{
		// bot is blocked by its caller limit of 0, traffic or not.
		{"bot", "pay", 0.99, 0, OverLimit, BoundCaller},
		{"mobile", "list", 0, 50, None, BoundCallee},
		{"mobile", "pay", 1 - 50.0/60, 50, OverCapacity, BoundProcedure},
		{"web", "list", 0.5, 50, OverCapacity, BoundCallee},
		{"web", "pay", 1 - 50.0/150, 50, OverCapacity, BoundProcedure},
	}
	if len(out) != 1 || len(out[0].Verdicts) != len(want) {
		t.Fatalf("got %+v", out)
	}
	for i, w := range want {
		v := out[0].Verdicts[i]
		if v.Caller != w.caller || v.Procedure != w.procedure || !near(v.Target, w.target) || v.Ratio != v.Target ||
			!near(v.Allowed, w.allowed) || v.Reason != w.reason || v.Bound != w.bound {
			t.Errorf("verdict %d = %+v, want %+v", i, v, w)
		}
	}
	if v := out[0].Verdicts[2]; v.Mode != Shadow {
		t.Errorf("mobile/pay mode %v, want shadow", v.Mode)
	}

	// web stops calling pay: its leaf releases from 2/3 (admitted share
	// 1/3 doubles per second) and is carried over until it reaches 0.
	svc.Callers = slices.DeleteFunc(slices.Clone(leaves), func(c Caller) bool { return c.Name == "web" && c.Procedure == "pay" })
	for i, w := range []float64{1.0 / 3, 0} {
		out = l.Step(time.Second, []Service{svc})
		checkOutput(t, DefaultConfig(), l, out)
		v, ok := findLeaf(out, "checkout", "web", "pay")
		if !ok || !near(v.Ratio, w) || v.Target != 0 || v.Offered != 0 {
			t.Errorf("step %d: web/pay = %+v (found %v), want ratio %v released", i, v, ok, w)
		}
	}
	if _, ok := findLeaf(l.Step(time.Second, []Service{svc}), "checkout", "web", "pay"); ok {
		t.Error("web/pay still carried at ratio 0")
	}
	if r := l.LeafRatio("checkout", "web", "pay"); r != 0 {
		t.Errorf("LeafRatio after release = %v", r)
	}
}

// A seeded leaf holds through a step that allows no release.
func TestSeedLeaf(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	l.SeedLeaf("checkout", "web", "pay", 0.7)
	l.Seed("checkout", "web", 0.2) // another leaf: the implicit procedure
	if l.Len() != 2 || l.LeafRatio("checkout", "web", "pay") != 0.7 || l.Ratio("checkout", "web") != 0.2 {
		t.Fatalf("after seeding: Len %d, ratios %v and %v", l.Len(), l.LeafRatio("checkout", "web", "pay"), l.Ratio("checkout", "web"))
	}
	out := l.Step(0, []Service{{Name: "checkout", Capacity: inf, Callers: []Caller{{Name: "web", Procedure: "pay", Offered: 100, Limit: inf}}}})
	if v, _ := findLeaf(out, "checkout", "web", "pay"); v.Ratio != 0.7 {
		t.Errorf("seeded web/pay stepped to %+v", v)
	}
}

// randomHierarchy is randomServices with procedures, procedure capacities
// and caller limits, some callees without any.
func randomHierarchy(r *rand.Rand, nServices, nCallers int) []Service {
	services := randomServices(r, nServices, nCallers)
	procs := []string{"", "_other", "_overflow", "/a.B/C", "GET /x"}
	for i := range services {
		s := &services[i]
		if r.IntN(4) == 0 {
			continue
		}
		for j := range s.Callers {
			s.Callers[j].Procedure = procs[r.IntN(len(procs))]
		}
		for _, p := range procs {
			if r.IntN(3) == 0 {
				s.Procedures = append(s.Procedures, Procedure{Name: p, Capacity: float64(r.IntN(nCallers * 50))})
			}
		}
		for c := range nCallers {
			if r.IntN(3) == 0 {
				s.CallerLimits = append(s.CallerLimits, CallerLimit{Name: fmt.Sprintf("caller-%d", c), Limit: float64(r.IntN(200))})
			}
		}
	}
	return services
}

// Step is deterministic with procedures too: shuffled input, bit-identical
// output; and what it allows is what Fill allows on the merged leaves.
func TestStepHierarchyDeterminism(t *testing.T) {
	checkStepDeterminism(t, 14, func(r *rand.Rand) []Service { return randomHierarchy(r, 6, 10) })
}

// The same with tiers: each (caller, procedure) of a random hierarchy
// gets a tier, now and then 0, and now and then a second entry of another
// tier.
func TestStepTiersDeterminism(t *testing.T) {
	checkStepDeterminism(t, 16, func(r *rand.Rand) []Service {
		in := randomHierarchy(r, 6, 10)
		for i := range in {
			s := &in[i]
			for j, n := 0, len(s.Callers); j < n; j++ {
				s.Callers[j].Tier = uint8(r.IntN(5))
				if r.IntN(2) == 0 {
					c := s.Callers[j]
					c.Tier, c.Offered = uint8(1+r.IntN(4)), c.Offered*r.Float64()
					s.Callers = append(s.Callers, c)
				}
			}
		}
		return in
	})
}

func checkStepDeterminism(t *testing.T, stream uint64, random func(*rand.Rand) []Service) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, stream))
		l1, l2 := mustNew(t, DefaultConfig()), mustNew(t, DefaultConfig())
		for step, dt := range []time.Duration{0, time.Second, 0, 2 * time.Second} {
			in := random(r)
			if step == 2 {
				in = in[:len(in)/2] // some leaves vanish
			}
			out1, out2 := l1.Step(dt, in), l2.Step(dt, shuffled(r, in))
			checkOutput(t, DefaultConfig(), l1, out1)
			if len(out1) != len(out2) {
				t.Fatalf("seed %d step %d: %d services vs %d", seed, step, len(out1), len(out2))
			}
			for i := range out1 {
				a, b := out1[i].Verdicts, out2[i].Verdicts
				if !slices.EqualFunc(a, b, func(x, y Verdict) bool {
					return x.Caller == y.Caller && x.Procedure == y.Procedure && x.Tier == y.Tier && x.Mode == y.Mode && x.Reason == y.Reason && x.Bound == y.Bound &&
						sameBits(x.Ratio, y.Ratio) && sameBits(x.Target, y.Target) && sameBits(x.Allowed, y.Allowed) &&
						sameBits(x.Offered, y.Offered) && sameBits(x.Limit, y.Limit)
				}) {
					t.Fatalf("seed %d step %d: %s differs:\n%+v\n%+v", seed, step, out1[i].Service, a, b)
				}
				checkAllowedIsFill(t, in, out1[i])
			}
		}
	}
}

// checkAllowedIsFill fills the tree of sv's service from the input and
// compares it with the verdicts of leaves that were not carried over.
func checkAllowedIsFill(t *testing.T, in []Service, sv ServiceVerdict) {
	t.Helper()
	tree := Tree{Capacity: inf}
	for _, s := range in {
		if s.Name == sv.Service {
			tree.Capacity = min(tree.Capacity, sanitizeLimit(s.Capacity))
			tree.Procedures = append(tree.Procedures, s.Procedures...)
			tree.Callers = append(tree.Callers, s.CallerLimits...)
		}
	}
	for _, v := range sv.Verdicts {
		tree.Leaves = append(tree.Leaves, Leaf{Caller: v.Caller, Procedure: v.Procedure, Tier: v.Tier, Offered: v.Offered, Limit: v.Limit})
	}
	var f Filler
	for i, s := range f.Fill(&tree) {
		if v := sv.Verdicts[i]; !sameBits(v.Allowed, s.Allowed) || v.Bound != s.Bound {
			t.Fatalf("%s: %s/%s allowed %v (%v), Fill says %v (%v)", sv.Service, v.Caller, v.Procedure, v.Allowed, v.Bound, s.Allowed, s.Bound)
		}
	}
}

// With procedures too, a steady state allocates only the slices Step
// returns.
func TestStepHierarchyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := mustNew(t, DefaultConfig())
	in := randomHierarchy(rand.New(rand.NewPCG(1, 14)), 50, 40)
	l.Step(0, in)
	l.Step(time.Second, in)
	if got := testing.AllocsPerRun(20, func() { l.Step(time.Second, in) }); got != 2 {
		t.Errorf("Step allocates %v times in a steady state, want 2", got)
	}
}
