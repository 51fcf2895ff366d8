package dropratio

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
)

// bisectShares is an independent max-min fair split: it searches the water
// level by bisection, where waterLevel sorts and walks up the demands.
func bisectShares(demands []float64, capacity float64) []float64 {
	total, top := 0.0, 0.0
	for _, d := range demands {
		total += d
		top = max(top, d)
	}
	out := slices.Clone(demands)
	if total <= capacity {
		return out
	}
	lo, hi := 0.0, top // Σ min(d, lo) <= capacity < Σ min(d, hi)
	for range 200 {
		mid := lo + (hi-lo)/2
		if mid == lo || mid == hi {
			break
		}
		sum := 0.0
		for _, d := range demands {
			sum += min(d, mid)
		}
		if sum <= capacity {
			lo = mid
		} else {
			hi = mid
		}
	}
	for i, d := range demands {
		out[i] = min(d, lo)
	}
	return out
}

// oracleFill computes what each leaf admits by the hierarchical law, with
// maps and bisection instead of Filler's sorted groups and waterLevel.
func oracleFill(t *Tree) []float64 {
	limitOf := func(m map[string]float64, name string) float64 {
		if v, ok := m[name]; ok {
			return v
		}
		return math.Inf(1)
	}
	callerLimit, procCap := map[string]float64{}, map[string]float64{}
	for _, c := range t.Callers {
		callerLimit[c.Name] = min(limitOf(callerLimit, c.Name), sanitizeLimit(c.Limit))
	}
	for _, p := range t.Procedures {
		procCap[p.Name] = min(limitOf(procCap, p.Name), sanitizeLimit(p.Capacity))
	}
	demand := make([]float64, len(t.Leaves))
	byCaller, byProc := map[string][]int{}, map[string][]int{}
	for i, lf := range t.Leaves {
		demand[i] = min(sanitizeOffered(lf.Offered), sanitizeLimit(lf.Limit))
		byCaller[lf.Caller] = append(byCaller[lf.Caller], i)
		byProc[lf.Procedure] = append(byProc[lf.Procedure], i)
	}
	split := func(idx []int, capacity float64) {
		ds := make([]float64, len(idx))
		for j, i := range idx {
			ds[j] = demand[i]
		}
		for j, s := range bisectShares(ds, capacity) {
			demand[idx[j]] = s
		}
	}
	for name, idx := range byCaller {
		split(idx, limitOf(callerLimit, name))
	}
	var names []string
	var procDemand []float64
	for name, idx := range byProc {
		sum := 0.0
		for _, i := range idx {
			sum += demand[i]
		}
		names = append(names, name)
		procDemand = append(procDemand, min(limitOf(procCap, name), sum))
	}
	for j, s := range bisectShares(procDemand, sanitizeLimit(t.Capacity)) {
		split(byProc[names[j]], s)
	}
	return demand
}

// randomTree draws a callee with up to 8 callers and 6 procedures, the
// reserved ones among them; rates spread over decades, with zeros and ties;
// limits and capacities that bind about half the time, 0 now and then;
// names listed twice, and lists in any order.
func randomTree(r *rand.Rand) *Tree {
	scale := math.Pow(10, float64(r.IntN(9)-2))
	rate := func() float64 {
		switch r.IntN(5) {
		case 0:
			return 0
		case 1:
			return float64(r.IntN(4)) * scale // ties
		}
		return r.ExpFloat64() * scale
	}
	bound := func(of float64) float64 {
		switch r.IntN(8) {
		case 0, 1, 2:
			return math.Inf(1)
		case 3:
			if r.IntN(4) == 0 {
				return 0
			}
		}
		return of * r.Float64() * 1.3
	}
	procs := []string{"", "_other", "_overflow", "/shop.Checkout/Pay", "GET /v1/items/{id}", "POST /v1/charges"}[:1+r.IntN(6)]
	t := &Tree{}
	for c := range 1 + r.IntN(8) {
		caller := fmt.Sprintf("caller-%d", c)
		sum := 0.0
		for _, p := range procs {
			if r.IntN(3) == 0 {
				continue
			}
			lf := Leaf{Caller: caller, Procedure: p, Offered: rate(), Limit: math.Inf(1)}
			if r.IntN(3) == 0 {
				lf.Limit = bound(lf.Offered)
			}
			sum += min(lf.Offered, lf.Limit)
			t.Leaves = append(t.Leaves, lf)
		}
		if r.IntN(2) == 0 {
			t.Callers = append(t.Callers, CallerLimit{Name: caller, Limit: bound(sum)})
		}
	}
	total := 0.0
	for _, p := range procs {
		sum := 0.0
		for _, lf := range t.Leaves {
			if lf.Procedure == p {
				sum += min(lf.Offered, lf.Limit)
			}
		}
		total += sum
		if r.IntN(2) == 0 {
			t.Procedures = append(t.Procedures, Procedure{Name: p, Capacity: bound(sum)})
		}
	}
	t.Capacity = bound(total)
	if r.IntN(10) == 0 && len(t.Procedures) > 0 { // a name listed twice: the lowest wins
		t.Procedures = append(t.Procedures, Procedure{Name: t.Procedures[0].Name, Capacity: bound(total)})
	}
	if r.IntN(10) == 0 && len(t.Callers) > 0 {
		t.Callers = append(t.Callers, CallerLimit{Name: t.Callers[0].Name, Limit: bound(total)})
	}
	r.Shuffle(len(t.Leaves), func(i, j int) { t.Leaves[i], t.Leaves[j] = t.Leaves[j], t.Leaves[i] })
	r.Shuffle(len(t.Procedures), func(i, j int) { t.Procedures[i], t.Procedures[j] = t.Procedures[j], t.Procedures[i] })
	return t
}

// TestFillAgainstOracle runs thousands of random trees through Fill and the
// oracle, and checks Fill's shares against every invariant of the law.
func TestFillAgainstOracle(t *testing.T) {
	const trials = 20000
	var f Filler
	var cut [BoundCallee + 1]int // leaves below their demand, by bound
	for seed := range uint64(trials) {
		r := rand.New(rand.NewPCG(seed, 14))
		tree := randomTree(r)
		shares := slices.Clone(f.Fill(tree))
		want := oracleFill(tree)
		scale := 0.0
		for _, lf := range tree.Leaves {
			scale = max(scale, sanitizeOffered(lf.Offered))
		}
		admitted := make([]float64, len(shares))
		for i, s := range shares {
			admitted[i] = min(sanitizeOffered(tree.Leaves[i].Offered), s.Allowed)
			if admitted[i] < sanitizeOffered(tree.Leaves[i].Offered) {
				cut[s.Bound]++
			}
			if math.Abs(admitted[i]-want[i]) > 1e-9*scale {
				t.Fatalf("seed %d: %s/%s admits %v, oracle %v\ntree %+v\nshares %+v",
					seed, tree.Leaves[i].Caller, tree.Leaves[i].Procedure, admitted[i], want[i], tree, shares)
			}
		}
		if msg := checkFillInvariants(tree, shares, admitted); msg != "" {
			t.Fatalf("seed %d: %s\ntree %+v\nshares %+v", seed, msg, tree, shares)
		}
		// The same tree in another order gives the same bits.
		perm := r.Perm(len(tree.Leaves))
		shuffled := *tree
		shuffled.Leaves = make([]Leaf, len(perm))
		for i, j := range perm {
			shuffled.Leaves[i] = tree.Leaves[j]
		}
		shuffled.Callers = slices.Clone(tree.Callers)
		slices.Reverse(shuffled.Callers)
		for i, s := range f.Fill(&shuffled) {
			if o := shares[perm[i]]; !sameBits(s.Allowed, o.Allowed) || s.Bound != o.Bound {
				t.Fatalf("seed %d: leaf %+v: %+v reordered, %+v before", seed, shuffled.Leaves[i], s, o)
			}
		}
	}
	// The trees must exercise every level, or the test proves little.
	t.Logf("leaves cut, by bound: %v", cut)
	for b := BoundLeaf; b <= BoundCallee; b++ {
		if cut[b] < trials/20 {
			t.Errorf("only %d leaves cut at the %v level in %d trees", cut[b], b, trials)
		}
	}
}

// checkFillInvariants returns what is wrong with shares, "" if nothing:
// every limit and capacity holds, no leaf admits more than it demands, and
// a leaf below its demand is at the top of the level that bounds it.
func checkFillInvariants(tree *Tree, shares []Share, admitted []float64) string {
	n := len(tree.Leaves)
	tol := 4 * float64(n+1) * 0x1p-52    // relative, for sums under a bound
	tiny := 4 * float64(n+1) * 0x1p-1074 // absolute, for subnormal rates
	scale := 0.0
	for _, a := range admitted {
		scale = max(scale, a)
	}
	eps := 1e-12*scale + tiny // for comparing single shares
	lowest := func(name string, values func(yield func(string, float64) bool)) float64 {
		v := math.Inf(1)
		for n, x := range values {
			if n == name {
				v = min(v, sanitizeLimit(x))
			}
		}
		return v
	}
	callerLimit := func(name string) float64 {
		return lowest(name, func(yield func(string, float64) bool) {
			for _, c := range tree.Callers {
				yield(c.Name, c.Limit)
			}
		})
	}
	procCap := func(name string) float64 {
		return lowest(name, func(yield func(string, float64) bool) {
			for _, p := range tree.Procedures {
				yield(p.Name, p.Capacity)
			}
		})
	}
	sumBy := func(key func(Leaf) string, name string) (sum float64, top float64) {
		for i, lf := range tree.Leaves {
			if key(lf) == name {
				sum += admitted[i]
				top = max(top, admitted[i])
			}
		}
		return sum, top
	}
	byCaller := func(l Leaf) string { return l.Caller }
	byProc := func(l Leaf) string { return l.Procedure }
	over := func(sum, bound float64) bool { return sum > bound*(1+tol)+tiny }

	total, topProc := 0.0, 0.0
	for _, a := range admitted {
		total += a
	}
	for _, lf := range tree.Leaves {
		s, _ := sumBy(byProc, lf.Procedure)
		topProc = max(topProc, s)
	}
	if over(total, sanitizeLimit(tree.Capacity)) {
		return fmt.Sprintf("callee admits %v over its capacity %v", total, tree.Capacity)
	}
	for i, lf := range tree.Leaves {
		d := min(sanitizeOffered(lf.Offered), sanitizeLimit(lf.Limit))
		s := shares[i]
		if !(admitted[i] >= 0) || admitted[i] > d {
			return fmt.Sprintf("%+v admits %v, demands %v", lf, admitted[i], d)
		}
		if s.Allowed > sanitizeLimit(lf.Limit) || (s.Bound == BoundNone) != math.IsInf(s.Allowed, 1) {
			return fmt.Sprintf("%+v: %+v", lf, s)
		}
		cs, ctop := sumBy(byCaller, lf.Caller)
		ps, ptop := sumBy(byProc, lf.Procedure)
		if over(cs, callerLimit(lf.Caller)) {
			return fmt.Sprintf("caller %s admits %v over its limit %v", lf.Caller, cs, callerLimit(lf.Caller))
		}
		if over(ps, procCap(lf.Procedure)) {
			return fmt.Sprintf("procedure %q admits %v over its capacity %v", lf.Procedure, ps, procCap(lf.Procedure))
		}
		if admitted[i] >= d {
			continue
		}
		// Below its demand: the level that bounds it is full, and the leaf
		// has at least what every sibling at that level has.
		switch s.Bound {
		case BoundCaller:
			if admitted[i] < ctop-eps {
				return fmt.Sprintf("%+v admits %v below a sibling in its caller at %v", lf, admitted[i], ctop)
			}
		case BoundProcedure, BoundCallee:
			if admitted[i] < ptop-eps {
				return fmt.Sprintf("%+v admits %v below a sibling in its procedure at %v", lf, admitted[i], ptop)
			}
			full := procCap(lf.Procedure)
			if s.Bound == BoundCallee {
				full = sanitizeLimit(tree.Capacity)
				if ps < topProc-eps*float64(n) {
					return fmt.Sprintf("procedure %q admits %v below another at %v", lf.Procedure, ps, topProc)
				}
				ps = total
			}
			if ps < full*(1-tol)-tiny {
				return fmt.Sprintf("%+v bound by %v, which admits %v of %v", lf, s.Bound, ps, full)
			}
		default:
			return fmt.Sprintf("%+v admits %v below its demand %v, bound %v", lf, admitted[i], d, s.Bound)
		}
	}
	return ""
}

// fillSeeds are FuzzFill's committed seeds.
func fillSeeds() []testkit.Seed {
	s := func(name string, args ...any) testkit.Seed { return testkit.Seed{Name: name, Args: args} }
	// four leaves' offered and limits (a/p, a/q, b/p, b/q), caller limits
	// a and b, capacities of p and q, callee capacity
	return []testkit.Seed{
		s("procedure-surge", 5000.0, 0.0, 80.0, 0.0, inf, inf, inf, inf, inf, inf, 300.0, inf, inf, uint8(0)),
		s("caller-across", 200.0, 30.0, 500.0, 0.0, inf, inf, inf, inf, 100.0, inf, inf, inf, inf, uint8(0)),
		s("nested", 150.0, 100.0, 60.0, 50.0, 80.0, inf, inf, inf, 120.0, inf, 100.0, inf, 200.0, uint8(0)),
		s("blocks", 0.0, 10.0, 10.0, 0.0, 0.0, inf, inf, 0.0, 0.0, inf, 0.0, inf, 0.0, uint8(0)),
		s("not-rates", nan, -1.0, negZero, -inf, nan, -1.0, negZero, -inf, nan, -1.0, negZero, nan, -inf, uint8(0)),
		s("overflow", math.MaxFloat64, math.MaxFloat64, math.MaxFloat64, math.MaxFloat64, inf, inf, inf, inf, inf, math.MaxFloat64, inf, inf, 1e308, uint8(0)),
		s("subnormal", 5e-324, 1e-310, 5e-324, 0.0, 5e-324, inf, 1e-320, inf, 5e-324, 1e-320, 5e-324, inf, 5e-324, uint8(0)),
		s("subnormal-rounding", 5e-324, 1e-310, 5e-324, 0.0, -7.0, inf, 1e-320, inf, 1.5e-323, 51.0, 5e-324, inf, 5e-324, uint8(0)),
		// tiers: 2 bits a leaf, a/p lowest; tiered, a fifth leaf a/p of
		// tier 4 (offered oaq, limit lbq) shares a/p's limit
		s("tiers-callee", 4000.0, 2000.0, 3000.0, 8000.0, inf, inf, inf, inf, inf, inf, inf, inf, 10000.0, uint8(0b11_10_01_01)),
		s("tiers-critical-over", 6000.0, 0.0, 6000.0, 0.0, inf, inf, inf, inf, inf, inf, inf, inf, 10000.0, uint8(0b00_01_00_01)),
		s("tiers-caller", 4000.0, 3000.0, 100.0, 0.0, inf, inf, inf, inf, 5000.0, inf, inf, inf, inf, uint8(0b00_00_11_10)),
		s("tiers-leaf", 80.0, 10.0, 5.0, 0.0, 50.0, inf, inf, 20.0, inf, inf, 30.0, inf, inf, uint8(0b01_10_11_10)),
		s("tiers-procedure", 900.0, 50.0, 900.0, 50.0, inf, inf, inf, inf, inf, inf, 1000.0, 60.0, 1050.0, uint8(0b11_01_10_01)),
	}
}

func TestFuzzFillCorpus(t *testing.T) { testkit.CheckCorpus(t, "FuzzFill", fillSeeds()) }

// FuzzFill checks Fill on two callers and two procedures at any rates,
// limits, capacities and tiers, invalid ones included, against the oracle
// and the law's invariants. tiers gives leaf k the tier tiers>>2k & 3; any
// tier adds a fifth leaf, a/p of tier 4, to share a/p's limit.
func FuzzFill(f *testing.F) {
	f.Fuzz(func(t *testing.T, oap, oaq, obp, obq, lap, laq, lbp, lbq, la, lb, cp, cq, c float64, tiers uint8) {
		tree := &Tree{
			Capacity:   c,
			Procedures: []Procedure{{Name: "p", Capacity: cp}, {Name: "q", Capacity: cq}},
			Callers:    []CallerLimit{{Name: "a", Limit: la}, {Name: "b", Limit: lb}},
			Leaves: []Leaf{
				{Caller: "a", Procedure: "p", Offered: oap, Limit: lap},
				{Caller: "a", Procedure: "q", Offered: oaq, Limit: laq},
				{Caller: "b", Procedure: "p", Offered: obp, Limit: lbp},
				{Caller: "b", Procedure: "q", Offered: obq, Limit: lbq},
			},
		}
		oracle := oracleFill
		if tiers != 0 {
			for k := range tree.Leaves {
				tree.Leaves[k].Tier = tiers >> (2 * k) & 3
			}
			tree.Leaves = append(tree.Leaves, Leaf{Caller: "a", Procedure: "p", Tier: 4, Offered: oaq, Limit: lbq})
			oracle = oracleTieredFill
		}
		var fl Filler
		shares := fl.Fill(tree)
		admitted := make([]float64, len(shares))
		total := 0.0
		for i, s := range shares {
			if math.IsNaN(s.Allowed) || s.Allowed < 0 {
				t.Fatalf("leaf %d: %+v", i, s)
			}
			admitted[i] = min(sanitizeOffered(tree.Leaves[i].Offered), s.Allowed)
			total += sanitizeOffered(tree.Leaves[i].Offered)
		}
		if tiers == 0 {
			if msg := checkFillInvariants(tree, shares, admitted); msg != "" {
				t.Fatal(msg)
			}
		}
		if msg, _ := checkTierInvariants(tree, shares, admitted); msg != "" {
			t.Fatal(msg)
		}
		if math.IsInf(total, 1) {
			return // the oracle's bisection sums overflow
		}
		for i, want := range oracle(tree) {
			if math.Abs(admitted[i]-want) > 1e-9*total {
				t.Fatalf("leaf %+v admits %v, oracle %v", tree.Leaves[i], admitted[i], want)
			}
		}
	})
}
