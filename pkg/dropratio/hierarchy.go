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
// at that level. A name listed twice takes the lowest value. Leaves that
// share a caller and a procedure are distinct siblings: [Law.Step] merges
// them before.
type Tree struct {
	Capacity   float64 // C, rps; +Inf means none
	Procedures []Procedure
	Callers    []CallerLimit
	Leaves     []Leaf
}

// Share is a leaf's allocation: it admits min(Offered, Allowed).
type Share struct {
	Allowed float64 // min(L_cp, λ_c, ν_p); +Inf when nothing bounds it
	Bound   Bound   // which of them sets Allowed; a limit wins a tie with a capacity
}

// Filler computes the hierarchical law, which shares one callee's capacity among leaves (caller,
// procedure) when limits nest:
//
//	callee capacity C ⊇ procedure capacity C_p ⊇ (caller, procedure) limit L_cp
//	                    caller limit L_c (across procedures) ⊇ L_cp
//
// A request is admitted only if every level admits it. [Filler.Fill]
// computes, for each leaf, the rate it is allowed, in two passes:
//
//  1. Bottom-up, the caller limits. A leaf demands d = min(R, L_cp), R its
//     offered rate. A caller whose leaves demand more than L_c in all has L_c
//     shared max-min fairly among them by demand, at the caller level λ_c:
//     d' = min(d, λ_c). A caller limit therefore never lets one of the
//     caller's procedures starve another.
//  2. Top-down, the capacities. Procedure p demands D_p = min(C_p, Σ d' of
//     its leaves); C is shared max-min fairly among procedures by D_p, at the
//     callee level μ: procedure p gets S_p = min(D_p, μ). Each S_p is shared
//     max-min fairly among the procedure's leaves by d', at the procedure's
//     level ν_p.
//
// A leaf is allowed min(L_cp, λ_c, ν_p) and admits min(R, allowed): every
// limit and capacity holds, no leaf gets more than it demands, and each
// capacity is shared max-min fairly among its children. Levels are +Inf
// where demands fit. Sums may exceed their bound by float rounding only:
// at most a relative 4·(n+1)·2⁻⁵², plus 4·(n+1) of the smallest subnormal,
// for n leaves (tested, and fuzzed).
//
// One known cost of doing the caller limits first: a caller over its limit
// whose share λ_c of one procedure is cut further by that procedure's
// capacity does not move the difference to its other procedures; the caller
// then admits less than L_c in all. The limits still hold; only the caller
// over its own limit and over a capacity loses, never a neighbour. Moving
// it would need the caller and capacity levels solved together, not in
// passes: not worth it until a scenario shows the corner matters.
//
// A callee that declares no procedures has one implicit procedure, named
// "" here ("*" in the limits), with no capacity of its own; without caller
// limits its split is exactly [Law.Step]'s, bit for bit (tested).
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
	scratch []float64
}

// procGroup is one procedure's leaves, perm[start:end] once sorted by
// procedure.
type procGroup struct {
	start, end int
	sum        float64 // Σ d' of its leaves, in caller order
	demand     float64 // D_p
}

// Fill returns the share of each of t's leaves, index for index. The slice
// is reused by the next call. The result depends on the names, rates and
// limits only, never on the order of any slice in t.
func (f *Filler) Fill(t *Tree) []Share {
	n := len(t.Leaves)
	f.shares = slices.Grow(f.shares[:0], n)[:n]
	f.demand = slices.Grow(f.demand[:0], n)[:n]
	for i := range t.Leaves {
		lf := &t.Leaves[i]
		limit := sanitizeLimit(lf.Limit)
		f.demand[i] = min(sanitizeOffered(lf.Offered), limit)
		f.shares[i] = Share{Allowed: limit, Bound: BoundLeaf}
		if math.IsInf(limit, 1) {
			f.shares[i].Bound = BoundNone
		}
	}
	f.callers = sortedLowest(f.callers, t.Callers, func(c CallerLimit) (string, float64) { return c.Name, c.Limit })
	f.procs = sortedLowest(f.procs, t.Procedures, func(p Procedure) (string, float64) { return p.Name, p.Capacity })

	f.sortLeaves(t.Leaves, compareByCaller)
	f.fillCallers(t.Leaves)
	f.sortLeaves(t.Leaves, compareByProcedure)
	f.fillProcedures(t.Leaves, sanitizeLimit(t.Capacity))
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

func compareByCaller(a, b *Leaf) int {
	return cmp.Or(strings.Compare(a.Caller, b.Caller), strings.Compare(a.Procedure, b.Procedure))
}

func compareByProcedure(a, b *Leaf) int {
	return cmp.Or(strings.Compare(a.Procedure, b.Procedure), strings.Compare(a.Caller, b.Caller))
}

// fillCallers caps each caller's demands at its level λ_c, with f.perm by
// caller.
func (f *Filler) fillCallers(leaves []Leaf) {
	for i := 0; i < len(f.perm); {
		name := leaves[f.perm[i]].Caller
		j := i + 1
		for j < len(f.perm) && leaves[f.perm[j]].Caller == name {
			j++
		}
		group := f.perm[i:j]
		i = j
		limit := lookup(f.callers, name, func(c CallerLimit) (string, float64) { return c.Name, c.Limit })
		level := f.level(group, limit)
		if limit == 0 {
			// A limit of 0 blocks, as a leaf's does: even a caller listed
			// without traffic is blocked from its first request.
			level = 0
		}
		if math.IsInf(level, 1) {
			continue
		}
		for _, k := range group {
			f.demand[k] = min(f.demand[k], level)
			if level < f.shares[k].Allowed {
				f.shares[k] = Share{Allowed: level, Bound: BoundCaller}
			}
		}
	}
}

// fillProcedures shares capacity among procedures and each procedure's share
// among its leaves, with f.perm by procedure.
func (f *Filler) fillProcedures(leaves []Leaf, capacity float64) {
	f.groups = f.groups[:0]
	for i := 0; i < len(f.perm); {
		name := leaves[f.perm[i]].Procedure
		g := procGroup{start: i}
		for i < len(f.perm) && leaves[f.perm[i]].Procedure == name {
			g.sum += f.demand[f.perm[i]]
			i++
		}
		g.end = i
		limit := lookup(f.procs, name, func(p Procedure) (string, float64) { return p.Name, p.Capacity })
		g.demand = min(limit, g.sum)
		f.groups = append(f.groups, g)
	}

	callee := math.Inf(1) // μ
	if !math.IsInf(capacity, 1) {
		sum := 0.0
		f.scratch = f.scratch[:0]
		for _, g := range f.groups {
			sum += g.demand
			f.scratch = append(f.scratch, g.demand)
		}
		if sum > capacity {
			callee = waterLevel(f.scratch, capacity)
		}
	}

	for _, g := range f.groups {
		share, bound := g.demand, BoundProcedure // S_p
		if callee < g.demand {
			share, bound = callee, BoundCallee
		}
		if !(g.sum > share) {
			continue
		}
		group := f.perm[g.start:g.end]
		f.scratch = f.scratch[:0]
		for _, k := range group {
			f.scratch = append(f.scratch, f.demand[k])
		}
		level := waterLevel(f.scratch, share) // ν_p
		for _, k := range group {
			if level < f.shares[k].Allowed {
				f.shares[k] = Share{Allowed: level, Bound: bound}
			}
		}
	}
}

// level returns the max-min fair level of limit among the leaves of group
// by their demands, +Inf when they fit. It is Law.level's rule: the sum runs
// in group order and only a sum above the limit sets a level.
func (f *Filler) level(group []int, limit float64) float64 {
	if math.IsInf(limit, 1) {
		return limit
	}
	sum := 0.0
	for _, k := range group {
		sum += f.demand[k]
	}
	if !(sum > limit) {
		return math.Inf(1)
	}
	f.scratch = f.scratch[:0]
	for _, k := range group {
		f.scratch = append(f.scratch, f.demand[k])
	}
	return waterLevel(f.scratch, limit)
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
