package dropratio

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// tierSplit shares limit among the leaves idx top-down by tier, max-min
// within a tier, by bisection: demand[i] becomes leaf i's share.
func tierSplit(leaves []Leaf, demand []float64, idx []int, limit float64) {
	var tiers []uint8
	for _, i := range idx {
		tiers = append(tiers, leaves[i].Tier)
	}
	slices.Sort(tiers)
	left := limit
	for _, t := range slices.Compact(tiers) {
		var of []int
		var ds []float64
		sum := 0.0
		for _, i := range idx {
			if leaves[i].Tier == t {
				of, ds = append(of, i), append(ds, demand[i])
				sum += demand[i]
			}
		}
		for j, s := range bisectShares(ds, left) {
			demand[of[j]] = s
		}
		if sum > left {
			left = 0
		} else {
			left -= sum
		}
	}
}

// oracleTieredFill computes what each leaf admits by the tiered law, with
// maps and bisection, one level at a time as Filler's doc states it.
func oracleTieredFill(t *Tree) []float64 {
	limitOf := func(m map[string]float64, name string) float64 {
		if v, ok := m[name]; ok {
			return v
		}
		return math.Inf(1)
	}
	callerLimit, procCap, leafLimit := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, c := range t.Callers {
		callerLimit[c.Name] = min(limitOf(callerLimit, c.Name), sanitizeLimit(c.Limit))
	}
	for _, p := range t.Procedures {
		procCap[p.Name] = min(limitOf(procCap, p.Name), sanitizeLimit(p.Capacity))
	}
	demand := make([]float64, len(t.Leaves))
	byLeaf, byCaller := map[string][]int{}, map[string][]int{}
	var tiers []uint8
	for i, lf := range t.Leaves {
		key := lf.Caller + "\x00" + lf.Procedure
		leafLimit[key] = min(limitOf(leafLimit, key), sanitizeLimit(lf.Limit))
		demand[i] = sanitizeOffered(lf.Offered)
		byLeaf[key] = append(byLeaf[key], i)
		byCaller[lf.Caller] = append(byCaller[lf.Caller], i)
		tiers = append(tiers, lf.Tier)
	}
	for key, idx := range byLeaf {
		tierSplit(t.Leaves, demand, idx, leafLimit[key])
	}
	for name, idx := range byCaller {
		tierSplit(t.Leaves, demand, idx, limitOf(callerLimit, name))
	}
	slices.Sort(tiers)
	calleeLeft := sanitizeLimit(t.Capacity)
	for _, tier := range slices.Compact(tiers) {
		byProc := map[string][]int{}
		for i, lf := range t.Leaves {
			if lf.Tier == tier {
				byProc[lf.Procedure] = append(byProc[lf.Procedure], i)
			}
		}
		var names []string
		var ds []float64
		sum := 0.0
		for name, idx := range byProc {
			d := 0.0
			for _, i := range idx {
				d += demand[i]
			}
			d = min(d, limitOf(procCap, name))
			names, ds = append(names, name), append(ds, d)
			sum += d
		}
		for j, s := range bisectShares(ds, calleeLeft) {
			idx := byProc[names[j]]
			tierSplit(t.Leaves, demand, idx, s)
			if c := limitOf(procCap, names[j]); !math.IsInf(c, 1) {
				procCap[names[j]] = max(c-s, 0)
			}
		}
		if sum > calleeLeft {
			calleeLeft = 0
		} else {
			calleeLeft -= sum
		}
	}
	return demand
}

// randomTieredTree draws a tree as randomTree does and gives each (caller,
// procedure) one to three tiers of CRITICAL_PLUS to SHEDDABLE, at rates of
// their own, now and then a tier-0 leaf among them, a duplicate of a tier,
// or a sibling that carries a different limit.
func randomTieredTree(r *rand.Rand) *Tree {
	t := randomTree(r)
	mixed := r.IntN(10) == 0
	var leaves []Leaf
	for _, lf := range t.Leaves {
		for j, x := range r.Perm(4)[:1+r.IntN(3)] {
			s := lf
			s.Tier = uint8(x + 1)
			if j > 0 {
				s.Offered = lf.Offered * 2 * r.Float64()
				if r.IntN(5) == 0 {
					s.Offered = 0
				}
			}
			switch r.IntN(20) {
			case 0:
				s.Limit = lf.Limit * r.Float64()
			case 1:
				leaves = append(leaves, s) // a duplicate: the tier shares max-min
			}
			if mixed && r.IntN(4) == 0 {
				s.Tier = 0
			}
			leaves = append(leaves, s)
		}
	}
	r.Shuffle(len(leaves), func(i, j int) { leaves[i], leaves[j] = leaves[j], leaves[i] })
	t.Leaves = leaves
	return t
}

// TestFillTiersAgainstOracle runs thousands of random tiered trees through
// Fill and the oracle, and checks Fill's shares against every invariant of
// the tiered law.
func TestFillTiersAgainstOracle(t *testing.T) {
	const trials = 20000
	var f Filler
	var cut [BoundCallee + 1]int // leaves below their offered rate, by bound
	shed := 0                    // leaves of a lower tier shed to 0 while a higher one is cut
	for seed := range uint64(trials) {
		r := rand.New(rand.NewPCG(seed, 16))
		tree := randomTieredTree(r)
		shares := slices.Clone(f.Fill(tree))
		want := oracleTieredFill(tree)
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
				t.Fatalf("seed %d: %+v admits %v, oracle %v\ntree %+v\nshares %+v", seed, tree.Leaves[i], admitted[i], want[i], tree, shares)
			}
		}
		msg, n := checkTierInvariants(tree, shares, admitted)
		if msg != "" {
			t.Fatalf("seed %d: %s\ntree %+v\nshares %+v", seed, msg, tree, shares)
		}
		shed += n
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
	t.Logf("leaves cut, by bound: %v; lower-tier leaves shed under a cut: %d", cut, shed)
	for b := BoundLeaf; b <= BoundCallee; b++ {
		if cut[b] < trials/20 {
			t.Errorf("only %d leaves cut at the %v level in %d trees", cut[b], b, trials)
		}
	}
	if shed < trials {
		t.Errorf("only %d lower-tier leaves shed in %d trees", shed, trials)
	}
}

// checkTierInvariants returns what is wrong with shares, "" if nothing,
// and how many leaves of a lower tier it found shed: every limit (a
// (caller, procedure)'s the lowest of its tiers') and capacity holds; no
// leaf admits more than it demands; at the level that bounds a cut leaf,
// every leaf of a lower tier that offers anything is allowed 0 (priority),
// and no leaf of the cut one's tier admits more than it (max-min); a cut at
// a capacity leaves nothing of it.
func checkTierInvariants(tree *Tree, shares []Share, admitted []float64) (string, int) {
	n := len(tree.Leaves)
	tol := 4 * float64(n+1) * 0x1p-52
	tiny := 4 * float64(n+1) * 0x1p-1074
	scale := 0.0
	for _, a := range admitted {
		scale = max(scale, a)
	}
	eps := 1e-12*scale + tiny
	over := func(sum, bound float64) bool { return sum > bound*(1+tol)+tiny }
	lowest := func(match func(i int) bool, limit func(i int) float64) float64 {
		v := math.Inf(1)
		for i := range n {
			if match(i) {
				v = min(v, limit(i))
			}
		}
		return v
	}
	callerLimit := func(name string) float64 {
		v := math.Inf(1)
		for _, c := range tree.Callers {
			if c.Name == name {
				v = min(v, sanitizeLimit(c.Limit))
			}
		}
		return v
	}
	procCap := func(name string) float64 {
		v := math.Inf(1)
		for _, p := range tree.Procedures {
			if p.Name == name {
				v = min(v, sanitizeLimit(p.Capacity))
			}
		}
		return v
	}
	// under returns whether leaf j is under the level b of leaf i.
	under := func(b Bound, i, j int) bool {
		li, lj := &tree.Leaves[i], &tree.Leaves[j]
		switch b {
		case BoundLeaf:
			return li.Caller == lj.Caller && li.Procedure == lj.Procedure
		case BoundCaller:
			return li.Caller == lj.Caller
		case BoundProcedure:
			return li.Procedure == lj.Procedure
		}
		return true
	}
	sum := func(match func(j int) bool) float64 {
		s := 0.0
		for j := range n {
			if match(j) {
				s += admitted[j]
			}
		}
		return s
	}
	total := sum(func(int) bool { return true })
	if over(total, sanitizeLimit(tree.Capacity)) {
		return fmt.Sprintf("callee admits %v over its capacity %v", total, tree.Capacity), 0
	}
	shed := 0
	for i, lf := range tree.Leaves {
		s := shares[i]
		sibling := func(j int) bool { return under(BoundLeaf, i, j) }
		leafLimit := lowest(sibling, func(j int) float64 { return sanitizeLimit(tree.Leaves[j].Limit) })
		offered := sanitizeOffered(lf.Offered)
		if !(admitted[i] >= 0) || admitted[i] > min(offered, sanitizeLimit(lf.Limit)) {
			return fmt.Sprintf("%+v admits %v", lf, admitted[i]), 0
		}
		if s.Allowed > leafLimit || (s.Bound == BoundNone) != math.IsInf(s.Allowed, 1) {
			return fmt.Sprintf("%+v: %+v, leaf limit %v", lf, s, leafLimit), 0
		}
		for _, c := range []struct {
			b     Bound
			limit float64
		}{{BoundLeaf, leafLimit}, {BoundCaller, callerLimit(lf.Caller)}, {BoundProcedure, procCap(lf.Procedure)}} {
			if got := sum(func(j int) bool { return under(c.b, i, j) }); over(got, c.limit) {
				return fmt.Sprintf("%+v: its %v level admits %v over %v", lf, c.b, got, c.limit), 0
			}
		}
		if !(admitted[i] < offered) || s.Bound == BoundNone {
			continue
		}
		for j := range n {
			lj := &tree.Leaves[j]
			if !under(s.Bound, i, j) {
				continue
			}
			if lj.Tier > lf.Tier && sanitizeOffered(lj.Offered) > 0 {
				if shares[j].Allowed != 0 {
					return fmt.Sprintf("%+v cut at the %v level to %v, but %+v of a lower tier is allowed %+v", lf, s.Bound, admitted[i], *lj, shares[j]), 0
				}
				shed++
			}
			if lj.Tier == lf.Tier && (s.Bound != BoundCallee || lj.Procedure == lf.Procedure) && admitted[j] > admitted[i]+eps {
				return fmt.Sprintf("%+v admits %v below %+v of its tier at %v, bound %v", lf, admitted[i], *lj, admitted[j], s.Bound), 0
			}
		}
		switch s.Bound {
		case BoundProcedure:
			if got := sum(func(j int) bool { return under(BoundProcedure, i, j) }); got < procCap(lf.Procedure)*(1-tol)-tiny {
				return fmt.Sprintf("%+v bound by its procedure, which admits %v of %v", lf, got, procCap(lf.Procedure)), 0
			}
		case BoundCallee:
			if total < sanitizeLimit(tree.Capacity)*(1-tol)-tiny {
				return fmt.Sprintf("%+v bound by the callee, which admits %v of %v", lf, total, tree.Capacity), 0
			}
			// Max-min among procedures within the tier.
			mine := sum(func(j int) bool { return tree.Leaves[j].Tier == lf.Tier && tree.Leaves[j].Procedure == lf.Procedure })
			for j := range n {
				lj := &tree.Leaves[j]
				other := sum(func(k int) bool { return tree.Leaves[k].Tier == lf.Tier && tree.Leaves[k].Procedure == lj.Procedure })
				if lj.Tier == lf.Tier && other > mine+eps*float64(n) {
					return fmt.Sprintf("%+v: its procedure admits %v of its tier, %q %v", lf, mine, lj.Procedure, other), 0
				}
			}
		}
	}
	return "", shed
}
