package dropratio

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

type wantShare struct {
	caller, procedure string
	allowed, admitted float64
	bound             Bound
}

func checkShares(t *testing.T, tree *Tree, want []wantShare) {
	t.Helper()
	var f Filler
	got := f.Fill(tree)
	if len(got) != len(tree.Leaves) {
		t.Fatalf("%d shares for %d leaves", len(got), len(tree.Leaves))
	}
	for _, w := range want {
		i := slices.IndexFunc(tree.Leaves, func(l Leaf) bool { return l.Caller == w.caller && l.Procedure == w.procedure })
		if i < 0 {
			t.Fatalf("no leaf %s/%s", w.caller, w.procedure)
		}
		s := got[i]
		admitted := min(tree.Leaves[i].Offered, s.Allowed)
		if !near(s.Allowed, w.allowed) || !near(admitted, w.admitted) || s.Bound != w.bound {
			t.Errorf("%s/%s: allowed %v admitted %v bound %v, want %v, %v, %v",
				w.caller, w.procedure, s.Allowed, admitted, s.Bound, w.allowed, w.admitted, w.bound)
		}
	}
}

// The procedure-surge scenario in miniature: three callers share a
// procedure's capacity; when one surges, the other two keep their max-min
// share.
func TestFillProcedureSurge(t *testing.T) {
	leaves := func(surge float64) []Leaf {
		return []Leaf{
			{Caller: "web", Procedure: "charge", Offered: 80, Limit: inf},
			{Caller: "mobile", Procedure: "charge", Offered: 120, Limit: inf},
			{Caller: "batch", Procedure: "charge", Offered: surge, Limit: inf},
		}
	}
	procs := []Procedure{{Name: "charge", Capacity: 300}}
	t.Run("calm", func(t *testing.T) {
		checkShares(t, &Tree{Capacity: inf, Procedures: procs, Leaves: leaves(90)}, []wantShare{
			{"web", "charge", inf, 80, BoundNone},
			{"mobile", "charge", inf, 120, BoundNone},
			{"batch", "charge", inf, 90, BoundNone},
		})
	})
	t.Run("surge", func(t *testing.T) {
		// web wants 80, under an equal third (100): it keeps all of it;
		// mobile and batch split the remaining 220.
		checkShares(t, &Tree{Capacity: inf, Procedures: procs, Leaves: leaves(5000)}, []wantShare{
			{"web", "charge", 110, 80, BoundProcedure},
			{"mobile", "charge", 110, 110, BoundProcedure},
			{"batch", "charge", 110, 110, BoundProcedure},
		})
	})
}

// A caller limit across two procedures is shared max-min fairly: the surge
// on one procedure does not starve the other.
func TestFillCallerLimitAcrossProcedures(t *testing.T) {
	tree := &Tree{
		Capacity: inf,
		Callers:  []CallerLimit{{Name: "web", Limit: 100}},
		Leaves: []Leaf{
			{Caller: "web", Procedure: "POST /v1/charges", Offered: 200, Limit: inf},
			{Caller: "web", Procedure: "GET /v1/items/{id}", Offered: 30, Limit: inf},
			{Caller: "mobile", Procedure: "POST /v1/charges", Offered: 500, Limit: inf},
		},
	}
	checkShares(t, tree, []wantShare{
		{"web", "POST /v1/charges", 70, 70, BoundCaller},
		{"web", "GET /v1/items/{id}", 70, 30, BoundCaller},
		{"mobile", "POST /v1/charges", inf, 500, BoundNone},
	})
}

// Every level at once, computed by hand.
func TestFillNested(t *testing.T) {
	tree := &Tree{
		Capacity:   200,
		Procedures: []Procedure{{Name: "pay", Capacity: 100}},
		Callers:    []CallerLimit{{Name: "web", Limit: 120}},
		Leaves: []Leaf{
			{Caller: "web", Procedure: "pay", Offered: 150, Limit: 80},
			{Caller: "mobile", Procedure: "pay", Offered: 60, Limit: inf},
			{Caller: "web", Procedure: "list", Offered: 100, Limit: inf},
			{Caller: "mobile", Procedure: "list", Offered: 50, Limit: inf},
			{Caller: "cron", Procedure: "list", Offered: 0, Limit: inf},
		},
	}
	// web demands 80 + 100 over its 120: λ = 60 each. pay demands
	// min(100, 60+60) = 100, list 60+50 = 110; the callee's 200 gives each
	// 100. pay's 100 is 50 a caller; list's 100 is 50 for mobile and web.
	checkShares(t, tree, []wantShare{
		{"web", "pay", 50, 50, BoundProcedure},
		{"mobile", "pay", 50, 50, BoundProcedure},
		{"web", "list", 50, 50, BoundCallee},
		{"mobile", "list", 50, 50, BoundCallee},
		{"cron", "list", 50, 0, BoundCallee},
	})
}

func TestFillUnbounded(t *testing.T) {
	tree := &Tree{
		Capacity:   inf,
		Procedures: []Procedure{{Name: "pay", Capacity: inf}},
		Callers:    []CallerLimit{{Name: "web", Limit: inf}},
		Leaves: []Leaf{
			{Caller: "web", Procedure: "pay", Offered: 1e12, Limit: inf},
			{Caller: "web", Procedure: "_other", Offered: 5, Limit: inf},
			{Caller: "mobile", Procedure: "_overflow", Offered: 0, Limit: inf},
		},
	}
	checkShares(t, tree, []wantShare{
		{"web", "pay", inf, 1e12, BoundNone},
		{"web", "_other", inf, 5, BoundNone},
		{"mobile", "_overflow", inf, 0, BoundNone},
	})
}

// Limits of 0 block, at the leaf and at the caller, traffic or not;
// a capacity of 0 shares nothing.
func TestFillBlocks(t *testing.T) {
	tree := &Tree{
		Capacity:   0,
		Procedures: []Procedure{{Name: "pay", Capacity: 0}},
		Callers:    []CallerLimit{{Name: "bot", Limit: 0}, {Name: "bot", Limit: 50}},
		Leaves: []Leaf{
			{Caller: "bot", Procedure: "pay", Offered: 0, Limit: inf},
			{Caller: "bot", Procedure: "list", Offered: 0, Limit: inf},
			{Caller: "web", Procedure: "list", Offered: 0, Limit: 0},
			{Caller: "web", Procedure: "pay", Offered: 0, Limit: inf},
			{Caller: "mobile", Procedure: "pay", Offered: 10, Limit: inf},
		},
	}
	checkShares(t, tree, []wantShare{
		{"bot", "pay", 0, 0, BoundCaller},
		{"bot", "list", 0, 0, BoundCaller},
		{"web", "list", 0, 0, BoundLeaf},
		{"web", "pay", 0, 0, BoundProcedure},
		{"mobile", "pay", 0, 0, BoundProcedure},
	})
}

// The known cost of applying caller limits first (see the package's
// hierarchical law): web's share of its limit on pay is cut to pay's
// capacity and not moved to list, so web admits 60 of its 100.
func TestFillCallerLimitThenCapacity(t *testing.T) {
	tree := &Tree{
		Capacity:   inf,
		Procedures: []Procedure{{Name: "pay", Capacity: 10}},
		Callers:    []CallerLimit{{Name: "web", Limit: 100}},
		Leaves: []Leaf{
			{Caller: "web", Procedure: "pay", Offered: 100, Limit: inf},
			{Caller: "web", Procedure: "list", Offered: 100, Limit: inf},
		},
	}
	checkShares(t, tree, []wantShare{
		{"web", "pay", 10, 10, BoundProcedure},
		{"web", "list", 50, 50, BoundCaller},
	})
}

// A callee without procedures or caller limits is split exactly as
// Law.level splits it, bit for bit, with the same reason.
func TestFillImplicitProcedureIsTodaysSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 1))
	var f Filler
	l := mustNew(t, DefaultConfig())
	for trial := range 5000 {
		svc := randomServices(r, 1, 1+trial%40)[0]
		if trial%7 == 0 {
			svc.Capacity = 0
		}
		rows := make([]row, 0, len(svc.Callers))
		for _, c := range svc.Callers {
			rows = merge(rows, &row{name: c.Name, offered: c.Offered, limit: c.Limit})
		}
		slices.SortFunc(rows, func(a, b row) int { return compareRows(&a, &b) })
		rows = slices.CompactFunc(rows, func(a, b row) bool { return a.name == b.name })
		tree := &Tree{Capacity: svc.Capacity}
		for _, rw := range slices.Backward(rows) { // order must not matter
			tree.Leaves = append(tree.Leaves, Leaf{Caller: rw.name, Offered: rw.offered, Limit: rw.limit})
		}
		shares := f.Fill(tree)
		level := l.level(rows, svc.Capacity)
		for i, lf := range tree.Leaves {
			want := min(lf.Limit, level)
			reason := OverLimit
			if level < lf.Limit {
				reason = OverCapacity
			}
			if !sameBits(shares[i].Allowed, want) || (!math.IsInf(want, 1) && shares[i].Bound.Reason() != reason) {
				t.Fatalf("trial %d: %s allowed %v (%v), today %v (%v)", trial, lf.Caller, shares[i].Allowed, shares[i].Bound, want, reason)
			}
		}
	}
}

func BenchmarkHierarchy(b *testing.B) { benchFill(b, benchTree()) }

// benchTree is a callee of 100 callers and 20 procedures, each of them
// limited, every caller calling every procedure.
func benchTree() *Tree {
	const callers, procedures = 100, 20
	r := rand.New(rand.NewPCG(100, 20))
	tree := &Tree{Capacity: 150_000}
	for p := range procedures {
		tree.Procedures = append(tree.Procedures, Procedure{Name: fmt.Sprintf("/shop.Checkout/M%02d", p), Capacity: 5000 + 5000*r.Float64()})
	}
	for c := range callers {
		name := fmt.Sprintf("caller-%03d", c)
		tree.Callers = append(tree.Callers, CallerLimit{Name: name, Limit: 800 + 1000*r.Float64()})
		for p := range procedures {
			tree.Leaves = append(tree.Leaves, Leaf{Caller: name, Procedure: tree.Procedures[p].Name, Offered: 100 * r.ExpFloat64(), Limit: 150})
		}
	}
	r.Shuffle(len(tree.Leaves), func(i, j int) { tree.Leaves[i], tree.Leaves[j] = tree.Leaves[j], tree.Leaves[i] })
	return tree
}

func benchFill(b *testing.B, tree *Tree) {
	var f Filler
	f.Fill(tree)
	b.ReportAllocs()
	for b.Loop() {
		f.Fill(tree)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(tree.Leaves)), "ns/leaf")
}
