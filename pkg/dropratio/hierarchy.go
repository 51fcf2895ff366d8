package dropratio

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Bound names the level that sets a leaf's allowed rate.
type Bound uint8

const (
	BoundNone      Bound = iota // nothing bounds the leaf: allowed is +Inf
	BoundLeaf                   // the leaf's own limit L_cp
	BoundCaller                 // the caller's share λ_c of its limit across procedures
	BoundProcedure              // the leaf's share of its procedure's capacity
	BoundCallee                 // the leaf's share of the callee's capacity
)

func (b Bound) String() string {
	switch b {
	case BoundNone:
		return "none"
	case BoundLeaf:
		return "leaf"
	case BoundCaller:
		return "caller"
	case BoundProcedure:
		return "procedure"
	case BoundCallee:
		return "callee"
	}
	return "Bound(" + strconv.Itoa(int(b)) + ")"
}

// Reason is the reason a leaf dropped at this bound is given: a limit of
// its own (leaf or caller) or a capacity it shares.
func (b Bound) Reason() Reason {
	switch b {
	case BoundLeaf, BoundCaller:
		return OverLimit
	case BoundProcedure, BoundCallee:
		return OverCapacity
	}
	return None
}

// Leaf is one (caller, procedure) bucket of a callee, with the rules of
// [Caller] for invalid rates and limits.
type Leaf struct {
	Caller    string
	Procedure string  // "" is the callee's implicit procedure
	Tier      uint8   // as Caller.Tier
	Offered   float64 // rps, dropped requests included
	Limit     float64 // L_cp, rps; +Inf means none, 0 blocks
}

// Procedure is a capacity that all callers of one procedure share.
type Procedure struct {
	Name     string
	Capacity float64 // C_p, rps; +Inf means none
}

// CallerLimit is a limit on one caller across all procedures of a callee.
type CallerLimit struct {
	Name  string
	Limit float64 // L_c, rps; +Inf means none
}

// Tree is one callee's hierarchy. Leaves may come in any order; a leaf
// naming a procedure or caller that is not listed has no capacity or limit
// at that level. A name listed twice takes the lowest value. Untiered
// (every leaf of tier 0), leaves that share a caller and a procedure are
// distinct siblings, each under its own limit: [Law.Step] merges them
// before. Tiered, the leaves of one (caller, procedure) share the lowest of
// their limits, top-down by tier, as [Filler] says; [Law.Step] merges those
// that share a tier too.
type Tree struct {
	Capacity   float64 // C, rps; +Inf means none
	Procedures []Procedure
	Callers    []CallerLimit
	Leaves     []Leaf
}

// Share is a leaf's allocation: it admits min(Offered, Allowed).
type Share struct {
	Allowed float64 // min(L_cp, λ_{c,t}, ν_{p,t}); +Inf when nothing bounds it
	Bound   Bound   // which of them sets Allowed; a limit wins a tie with a capacity
}

// Filler computes the hierarchical law, which shares one callee's capacity among leaves (caller,
// procedure, tier) when limits nest:
//
//	callee capacity C ⊇ procedure capacity C_p ⊇ (caller, procedure) limit L_cp ⊇ tiers
//	                    caller limit L_c (across procedures) ⊇ L_cp
//
// A request is admitted only if every level admits it. [Filler.Fill]
// computes, for each leaf, the rate it is allowed.
//
// Every level shares its rate top-down by tier (criticality): the demand of
// tier 1 first, max-min fairly among the level's children of that tier; then
// tier 2 from what is left, and so on; a larger tier is a lower one, shed
// first. A tier whose demand fits takes it and is not bound there (its level
// is +Inf); the first tier that does not fit shares what is left max-min
// fairly, at a level; the tiers below it find 0 left. So at any level that
// binds, every leaf of a lower tier is cut to 0 before a leaf of a higher one
// loses anything. Tier 0 (untiered) is a tier like the others, served
// before tier 1 should a tree mix them (a callee's buckets are all tiered
// or all not); a tree of tier 0 alone has one tier at every level, and its
// split is bit for bit what it was before tiers existed (tested).
//
//  0. The leaf limit. The leaves of one (caller, procedure), one per tier,
//     share its limit L_cp, which each of them carries; should they carry
//     different ones, the lowest applies to all of them. Leaf i demands d_i,
//     its offered rate R_i, capped top-down by tier: d_i = min(R_i, what L_cp
//     leaves after the higher tiers' R). Its allowed rate starts at L_cp, or
//     at the level of its tier where that is lower.
//  1. Bottom-up, the caller limits. A caller whose leaves demand more than
//     L_c in all has L_c shared top-down by tier among them, max-min among
//     its procedures within a tier, at the level λ_{c,t} of its tier t:
//     d'_i = min(d_i, λ_{c,t}). A caller limit therefore never lets one of
//     the caller's procedures starve another of the same tier, and sheds its
//     own lower tiers first.
//  2. Top-down, the capacities, one tier at a time from tier 1. Procedure p
//     demands, in tier t, D_{p,t} = min(Σ d' of its tier-t leaves, what C_p
//     left after the higher tiers). What C left after the higher tiers is
//     shared max-min fairly among procedures by D_{p,t}, at the callee level
//     μ_t: procedure p gets S_{p,t} = min(D_{p,t}, μ_t), which its capacity
//     loses for the tiers below. Each S_{p,t} is shared max-min fairly among
//     the procedure's tier-t leaves by d', at the level ν_{p,t}.
//
// A leaf is allowed min(L_cp or its tier's level there, λ_{c,t}, ν_{p,t})
// and admits min(R, allowed): every limit and capacity holds, no leaf gets
// more than it demands, and each capacity is shared max-min fairly among the
// children of one tier. Levels are +Inf where demands fit. Sums may exceed
// their bound by float rounding only: at most a relative 4·(n+1)·2⁻⁵², plus
// 4·(n+1) of the smallest subnormal, for n leaves (tested, and fuzzed).
//
// A tier that finds nothing left of a limit (L_cp or L_c above 0) is cut to
// 0 only in its leaves that demand something: a leaf that demands nothing
// keeps what it had, so that an allowed rate of 0 at a limit stays the mark
// of a block (a limit of 0), which [Law] enforces even without traffic.
//
// One known cost of doing the caller limits first: a caller over its limit
// whose share λ_{c,t} of one procedure is cut further by that procedure's
// capacity does not move the difference to its other procedures or to its
// lower tiers; the caller then admits less than L_c in all. The limits still
// hold; only the caller over its own limit and over a capacity loses, never
// a neighbour. Moving it would need the caller and capacity levels solved
// together, not in passes: not worth it until a scenario shows the corner
// matters.
//
// A callee that declares no procedures has one implicit procedure, named
// "" here ("*" in the limits), with no capacity of its own; without caller
// limits and tiers its split is exactly [Law.Step]'s, bit for bit (tested).
//
// The reserved procedures "_other" (requests no route matched) and
// "_overflow" (leaves beyond a sidecar's bound) are ordinary leaves here.
//
// A level below the leaf (descriptor values, such as tenants) nests by
// passing, as the leaf's Offered, what its values demand in all, Σ min(R_v,
// L_v), and sharing the leaf's allowed rate among them with the same
// max-min split.
//
// Its zero value is ready; it keeps scratch space between calls so that a
// steady state allocates nothing. Not safe for concurrent use.
type Filler struct {
	shares  []Share
	demand  []float64 // d, then d' (capped by the caller level)
	perm    []int
	procs   []Procedure
	callers []CallerLimit
	groups  []procGroup
	left    []procLeft // what each procedure's capacity has left, by name, when tiered
	scratch []float64
}

// procGroup is one (tier, procedure)'s leaves, perm[start:end] once sorted
// by tier and procedure.
type procGroup struct {
	start, end int
	tier       uint8
	proc       int     // index in Filler.left, when tiered
	sum        float64 // Σ d' of its leaves, in caller order
	demand     float64 // D_{p,t}
}

// procLeft is what a procedure's capacity has left for the tiers not yet
// served.
type procLeft struct {
	name string
	left float64
}

// Fill returns the share of each of t's leaves, index for index. The slice
// is reused by the next call. The result depends on the names, tiers, rates
// and limits only, never on the order of any slice in t.
func (f *Filler) Fill(t *Tree) []Share {
	n := len(t.Leaves)
	f.shares = slices.Grow(f.shares[:0], n)[:n]
	f.demand = slices.Grow(f.demand[:0], n)[:n]
	tiered := false
	for i := range t.Leaves {
		lf := &t.Leaves[i]
		limit := sanitizeLimit(lf.Limit)
		f.demand[i] = min(sanitizeOffered(lf.Offered), limit)
		f.shares[i] = Share{Allowed: limit, Bound: BoundLeaf}
		if math.IsInf(limit, 1) {
			f.shares[i].Bound = BoundNone
		}
		tiered = tiered || lf.Tier != 0
	}
	f.callers = sortedLowest(f.callers, t.Callers, func(c CallerLimit) (string, float64) { return c.Name, c.Limit })
	f.procs = sortedLowest(f.procs, t.Procedures, func(p Procedure) (string, float64) { return p.Name, p.Capacity })

	if tiered {
		// Untiered, each (caller, procedure) has one leaf: nothing to share.
		f.sortLeaves(t.Leaves, compareByLeaf)
		f.fillLeaves(t.Leaves)
	}
	f.sortLeaves(t.Leaves, compareByCaller)
	f.fillCallers(t.Leaves)
	f.sortLeaves(t.Leaves, compareByTier)
	f.fillProcedures(t.Leaves, sanitizeLimit(t.Capacity), tiered)
	return f.shares
}

// sortLeaves sets f.perm to the leaves' indices in cmp's order, ties by
// value and then by index, so that every sum below runs in one order.
func (f *Filler) sortLeaves(leaves []Leaf, compare func(a, b *Leaf) int) {
	f.perm = f.perm[:0]
	for i := range leaves {
		f.perm = append(f.perm, i)
	}
	slices.SortFunc(f.perm, func(a, b int) int {
		if c := compare(&leaves[a], &leaves[b]); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(f.demand[a], f.demand[b]), cmp.Compare(a, b))
	})
}

// The orders of the three passes. Untiered, compareByCaller and
// compareByTier are the orders of the law before tiers, so that its sums
// run in the same order and give the same bits.

func compareByLeaf(a, b *Leaf) int {
	return cmp.Or(strings.Compare(a.Caller, b.Caller), strings.Compare(a.Procedure, b.Procedure), cmp.Compare(a.Tier, b.Tier))
}

func compareByCaller(a, b *Leaf) int {
	return cmp.Or(strings.Compare(a.Caller, b.Caller), cmp.Compare(a.Tier, b.Tier), strings.Compare(a.Procedure, b.Procedure))
}

func compareByTier(a, b *Leaf) int {
	return cmp.Or(cmp.Compare(a.Tier, b.Tier), strings.Compare(a.Procedure, b.Procedure), strings.Compare(a.Caller, b.Caller))
}

// groupEnd returns the end of the run of f.perm from i whose leaves compare
// equal to leaves[f.perm[i]] by same.
func (f *Filler) groupEnd(leaves []Leaf, i int, same func(a, b *Leaf) bool) int {
	first := &leaves[f.perm[i]]
	j := i + 1
	for j < len(f.perm) && same(first, &leaves[f.perm[j]]) {
		j++
	}
	return j
}

func sameLeaf(a, b *Leaf) bool   { return a.Caller == b.Caller && a.Procedure == b.Procedure }
func sameCaller(a, b *Leaf) bool { return a.Caller == b.Caller }
func sameTier(a, b *Leaf) bool   { return a.Tier == b.Tier }

// fillLeaves shares each (caller, procedure)'s limit among its tiers, with
// f.perm by leaf, then tier.
func (f *Filler) fillLeaves(leaves []Leaf) {
	for i := 0; i < len(f.perm); {
		j := f.groupEnd(leaves, i, sameLeaf)
		group := f.perm[i:j]
		i = j
		limit := math.Inf(1)
		for _, k := range group {
			limit = min(limit, sanitizeLimit(leaves[k].Limit))
		}
		if len(group) == 1 || math.IsInf(limit, 1) {
			continue // its own limit is already applied
		}
		f.cut(group, limit, BoundLeaf, false)
		f.shareByTier(leaves, group, limit, BoundLeaf)
	}
}

// fillCallers caps each caller's demands at its levels λ_{c,t}, with f.perm
// by caller, then tier.
func (f *Filler) fillCallers(leaves []Leaf) {
	for i := 0; i < len(f.perm); {
		j := f.groupEnd(leaves, i, sameCaller)
		group := f.perm[i:j]
		name := leaves[group[0]].Caller
		i = j
		limit := lookup(f.callers, name, func(c CallerLimit) (string, float64) { return c.Name, c.Limit })
		if limit == 0 {
			// A limit of 0 blocks, as a leaf's does: even a caller listed
			// without traffic is blocked from its first request.
			f.cut(group, 0, BoundCaller, false)
			continue
		}
		f.shareByTier(leaves, group, limit, BoundCaller)
	}
}

// shareByTier shares limit among the leaves of group, sorted by tier,
// top-down by tier, and cuts each tier's leaves to its level.
func (f *Filler) shareByTier(leaves []Leaf, group []int, limit float64, bound Bound) {
	if math.IsInf(limit, 1) {
		return
	}
	left := limit
	for s := 0; s < len(group); {
		e := s + 1
		for e < len(group) && leaves[group[e]].Tier == leaves[group[s]].Tier {
			e++
		}
		tier := group[s:e]
		s = e
		level, rest := f.level(tier, left)
		// left is 0 here only when higher tiers took all of a limit above 0.
		f.cut(tier, level, bound, left == 0)
		left = rest
	}
}

// cut caps the demands of group at level and sets level as the allowed rate
// of those it lowers; spare leaves the leaves that demand nothing alone.
func (f *Filler) cut(group []int, level float64, bound Bound, spare bool) {
	if math.IsInf(level, 1) {
		return
	}
	for _, k := range group {
		if spare && f.demand[k] == 0 {
			continue
		}
		f.demand[k] = min(f.demand[k], level)
		if level < f.shares[k].Allowed {
			f.shares[k] = Share{Allowed: level, Bound: bound}
		}
	}
}

// fillProcedures shares capacity among procedures and each procedure's share
// among its leaves, tier by tier, with f.perm by tier, then procedure.
func (f *Filler) fillProcedures(leaves []Leaf, capacity float64, tiered bool) {
	f.groups = f.groups[:0]
	for i := 0; i < len(f.perm); {
		lf := &leaves[f.perm[i]]
		g := procGroup{start: i, tier: lf.Tier}
		for i < len(f.perm) && sameTier(lf, &leaves[f.perm[i]]) && leaves[f.perm[i]].Procedure == lf.Procedure {
			g.sum += f.demand[f.perm[i]]
			i++
		}
		g.end = i
		f.groups = append(f.groups, g)
	}
	if tiered {
		f.indexProcedures(leaves)
	}

	for a := 0; a < len(f.groups); {
		b := a + 1
		for b < len(f.groups) && f.groups[b].tier == f.groups[a].tier {
			b++
		}
		capacity = f.fillTier(leaves, f.groups[a:b], capacity, tiered)
		a = b
	}
	clear(f.left) // do not keep names alive
}

// indexProcedures sets f.left to the procedures of f.groups, by name, with
// their capacities, and each group's index in it.
func (f *Filler) indexProcedures(leaves []Leaf) {
	f.left = f.left[:0]
	for _, g := range f.groups {
		f.left = append(f.left, procLeft{name: leaves[f.perm[g.start]].Procedure})
	}
	slices.SortFunc(f.left, func(a, b procLeft) int { return strings.Compare(a.name, b.name) })
	f.left = slices.CompactFunc(f.left, func(a, b procLeft) bool { return a.name == b.name })
	for k := range f.left {
		f.left[k].left = lookup(f.procs, f.left[k].name, func(p Procedure) (string, float64) { return p.Name, p.Capacity })
	}
	for k := range f.groups {
		f.groups[k].proc, _ = slices.BinarySearchFunc(f.left, leaves[f.perm[f.groups[k].start]].Procedure, func(e procLeft, name string) int {
			return strings.Compare(e.name, name)
		})
	}
}

// fillTier serves one tier's groups from capacity, what the callee has left,
// and returns what it leaves for the tiers below.
func (f *Filler) fillTier(leaves []Leaf, groups []procGroup, capacity float64, tiered bool) float64 {
	for k := range groups {
		g := &groups[k]
		if tiered {
			g.demand = min(f.left[g.proc].left, g.sum)
		} else {
			g.demand = min(lookup(f.procs, leaves[f.perm[g.start]].Procedure, func(p Procedure) (string, float64) { return p.Name, p.Capacity }), g.sum)
		}
	}

	callee := math.Inf(1) // μ_t
	if !math.IsInf(capacity, 1) {
		sum := 0.0
		f.scratch = f.scratch[:0]
		for _, g := range groups {
			sum += g.demand
			f.scratch = append(f.scratch, g.demand)
		}
		if sum > capacity {
			callee = waterLevel(f.scratch, capacity)
			capacity = 0
		} else {
			capacity -= sum
		}
	}

	for _, g := range groups {
		share, bound := g.demand, BoundProcedure // S_{p,t}
		if callee < g.demand {
			share, bound = callee, BoundCallee
		}
		if tiered && !math.IsInf(f.left[g.proc].left, 1) {
			f.left[g.proc].left = max(f.left[g.proc].left-share, 0)
		}
		if !(g.sum > share) {
			continue
		}
		group := f.perm[g.start:g.end]
		f.scratch = f.scratch[:0]
		for _, k := range group {
			f.scratch = append(f.scratch, f.demand[k])
		}
		f.cut(group, waterLevel(f.scratch, share), bound, false) // ν_{p,t}
	}
	return capacity
}

// level returns the max-min fair level of limit among the leaves of group
// by their demands, +Inf when they fit, and what the group leaves of limit.
// It is Law.level's rule: the sum runs in group order and only a sum above
// the limit sets a level.
func (f *Filler) level(group []int, limit float64) (level, rest float64) {
	if math.IsInf(limit, 1) {
		return limit, limit
	}
	sum := 0.0
	for _, k := range group {
		sum += f.demand[k]
	}
	if !(sum > limit) {
		return math.Inf(1), limit - sum
	}
	f.scratch = f.scratch[:0]
	for _, k := range group {
		f.scratch = append(f.scratch, f.demand[k])
	}
	return waterLevel(f.scratch, limit), 0
}

// sortedLowest copies in into dst sorted by name, one entry per name with the
// lowest sanitized value.
func sortedLowest[T any](dst, in []T, kv func(T) (string, float64)) []T {
	dst = append(dst[:0], in...)
	slices.SortFunc(dst, func(a, b T) int {
		na, va := kv(a)
		nb, vb := kv(b)
		return cmp.Or(strings.Compare(na, nb), cmp.Compare(sanitizeLimit(va), sanitizeLimit(vb)))
	})
	return slices.CompactFunc(dst, func(a, b T) bool {
		na, _ := kv(a)
		nb, _ := kv(b)
		return na == nb
	})
}

// lookup returns the sanitized value named name in sorted, +Inf if none.
func lookup[T any](sorted []T, name string, kv func(T) (string, float64)) float64 {
	i, ok := slices.BinarySearchFunc(sorted, name, func(e T, name string) int {
		n, _ := kv(e)
		return strings.Compare(n, name)
	})
	if !ok {
		return math.Inf(1)
	}
	_, v := kv(sorted[i])
	return sanitizeLimit(v)
}
